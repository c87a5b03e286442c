//===- SizeLimits.cpp - upper bounds on a config's counts and widths ------===//

#include "parser/SizeLimits.h"

#include <string>

namespace adapt {

// Largest released values (../shared/models): hidden 16384, intermediate
// 53248, 896 experts (the 2.8T target), 256 heads, head dim 576 (MLA), vocab
// 262144, 94 layers, 10M positions (Llama-4 Scout). Each bound is >= 8x.
const SizeLimit kSizeLimits[] = {
    {"hidden_size", 1 << 17},            // 131072
    {"intermediate_size", 1 << 20},      // 1048576 (dense and expert MLPs)
    {"num_experts", 1 << 16},            // 65536 routed experts
    {"num_experts_per_tok", 1 << 12},    // top-k
    {"n_shared_experts", 1 << 10},
    {"num_attention_heads", 1 << 12},    // also KV, linear and indexer heads
    {"head_dim", 1 << 13},               // q/k/v, rope and nope, linear heads
    {"kv_lora_rank", 1 << 15},           // MLA ranks
    {"vocab_size", 1 << 24},
    {"num_hidden_layers", 1 << 12},      // also MTP layers and encoder depth
    {"max_position_embeddings", int64_t(1) << 32},
};
const size_t kSizeLimitCount = sizeof(kSizeLimits) / sizeof(kSizeLimits[0]);

namespace {

int64_t limitOf(const char *key) {
  for (const SizeLimit &l : kSizeLimits)
    if (std::string(l.key) == key)
      return l.maximum;
  return 0;
}

} // namespace

std::optional<InputError> checkSizeLimits(const ModelSpec &spec) {
  std::optional<InputError> found;
  auto check = [&](const char *key, int64_t value, const std::string &where = "") {
    if (found || value <= limitOf(key))
      return;
    found = InputError{spec.configFile, where + key,
                       "expected at most " + std::to_string(limitOf(key)) +
                           " (no released model comes within 8x), got " + std::to_string(value)};
  };
  check("hidden_size", spec.hidden);
  check("vocab_size", spec.vocab);
  check("max_position_embeddings", spec.maxPositions);
  check("num_hidden_layers", static_cast<int64_t>(spec.layers.size()));
  check("num_hidden_layers", spec.numMtpLayers, "mtp ");
  for (const LayerSpec &layer : spec.layers) {
    const std::string at = "layer " + std::to_string(layer.index) + ": ";
    const MixerSpec &m = layer.mixer;
    for (int64_t heads : {m.numHeads, m.numKvHeads, m.linearKeyHeads, m.linearValueHeads, m.indexHeads})
      check("num_attention_heads", heads, at);
    for (int64_t dim : {m.headDim, m.vHeadDim, m.qkNopeDim, m.qkRopeDim, m.linearKeyDim, m.linearValueDim,
                        m.indexHeadDim})
      check("head_dim", dim, at);
    check("kv_lora_rank", m.kvLoraRank, at);
    check("kv_lora_rank", m.qLoraRank, at);
    const FfnSpec &f = layer.ffn;
    check("intermediate_size", f.intermediate, at);
    check("intermediate_size", f.expertIntermediate, at);
    check("intermediate_size", f.sharedIntermediate, at);
    check("num_experts", f.numExperts, at);
    check("num_experts_per_tok", f.topK, at);
    check("n_shared_experts", f.numShared, at);
    if (found)
      return found;
  }
  for (const EncoderSpec &e : spec.encoders) {
    const std::string at = e.modality + " encoder: ";
    check("num_hidden_layers", e.depth, at);
    check("hidden_size", e.hidden, at);
    check("hidden_size", e.outHidden, at);
    check("intermediate_size", e.intermediate, at);
    check("num_attention_heads", e.numHeads, at);
  }
  return found;
}

} // namespace adapt
