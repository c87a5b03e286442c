//===- WeightSchema.cpp - the tensors a config implies --------------------===//

#include "models/WeightSchema.h"
#include "parser/ConfigReader.h"

#include <algorithm>

namespace adapt {

namespace {

using Shape = std::vector<int64_t>;

/// Appends weights to one component with a common name prefix.
class ComponentBuilder {
public:
  ComponentBuilder(std::vector<ComponentDecl> &out, std::string kind,
                   int64_t layer, std::string prefix)
      : out(out), prefix(std::move(prefix)) {
    out.push_back(ComponentDecl{std::move(kind), layer, {}});
    index = out.size() - 1;
  }
  /// A matmul weight [out, in], optionally with a bias [out].
  void linear(const std::string &role, int64_t outDim, int64_t inDim,
              bool bias = false) {
    add(role, role + ".weight", {outDim, inDim}, true);
    if (bias)
      add(role + ".bias", role + ".bias", {outDim});
  }
  /// Any other tensor.
  void add(const std::string &role, const std::string &name, Shape shape,
           bool isLinear = false) {
    out[index].weights.push_back(
        WeightDecl{role, prefix + name, std::move(shape), 0, isLinear, false});
  }
  /// One tensor per routed expert, "{e}" in the name.
  void perExpert(const std::string &role, const std::string &name,
                 Shape shape, int64_t experts) {
    out[index].weights.push_back(
        WeightDecl{role, prefix + name, std::move(shape), experts, true, true});
  }
  /// A fused tensor holding all routed experts, shape [E, ...].
  void fusedExperts(const std::string &role, const std::string &name,
                    Shape shape, bool isLinear) {
    out[index].weights.push_back(
        WeightDecl{role, prefix + name, std::move(shape), 0, isLinear, true});
  }

private:
  std::vector<ComponentDecl> &out;
  std::string prefix;
  size_t index;
};

bool isFamily(const ModelSpec &spec, std::initializer_list<const char *> names) {
  for (const char *n : names)
    if (spec.family == n)
      return true;
  return false;
}

/// Softmax attention (MHA/GQA) with the family's naming.
void declareAttention(const ModelSpec &spec, const MixerSpec &m,
                      ComponentBuilder &b) {
  int64_t h = spec.hidden;
  int64_t qOut = m.numHeads * m.headDim * (m.outputGate ? 2 : 1);
  int64_t kvOut = m.numKvHeads * m.headDim;
  bool oBias = spec.family == "gpt_oss";
  b.linear("q_proj", qOut, h, m.qkvBias);
  b.linear("k_proj", kvOut, h, m.qkvBias);
  b.linear("v_proj", kvOut, h, m.qkvBias);
  b.linear("o_proj", h, m.numHeads * m.headDim, oBias);
  // Llama-4's QK-norm is a parameter-free L2 norm (transformers'
  // Llama4TextL2Norm): no tensors.
  if (m.qkNorm && spec.family != "llama4") {
    if (spec.family == "minimax_m2") {
      b.add("q_norm", "q_norm.weight", {m.numHeads * m.headDim});
      b.add("k_norm", "k_norm.weight", {kvOut});
    } else if (spec.family == "hunyuan") {
      b.add("q_norm", "query_layernorm.weight", {m.headDim});
      b.add("k_norm", "key_layernorm.weight", {m.headDim});
    } else {
      b.add("q_norm", "q_norm.weight", {m.headDim});
      b.add("k_norm", "k_norm.weight", {m.headDim});
    }
  }
  if (m.sinks)
    b.add("sinks", "sinks", {m.numHeads});
}

/// Multi-head latent attention, plus the sparse-attention indexer.
void declareMla(const ModelSpec &spec, const MixerSpec &m, ComponentBuilder &b) {
  int64_t h = spec.hidden;
  int64_t qHead = m.qkNopeDim + m.qkRopeDim;
  if (m.qLoraRank > 0) {
    b.linear("q_a_proj", m.qLoraRank, h);
    b.add("q_a_layernorm", "q_a_layernorm.weight", {m.qLoraRank});
    b.linear("q_b_proj", m.numHeads * qHead, m.qLoraRank);
  } else {
    b.linear("q_proj", m.numHeads * qHead, h);
  }
  b.linear("kv_a_proj_with_mqa", m.kvLoraRank + m.qkRopeDim, h);
  b.add("kv_a_layernorm", "kv_a_layernorm.weight", {m.kvLoraRank});
  b.linear("kv_b_proj", m.numHeads * (m.qkNopeDim + m.vHeadDim), m.kvLoraRank);
  b.linear("o_proj", h, m.numHeads * m.vHeadDim);
  if (m.indexTopK > 0 && !m.reusesIndexer) {
    int64_t qIn = m.qLoraRank > 0 ? m.qLoraRank : h;
    b.linear("indexer.wq_b", m.indexHeads * m.indexHeadDim, qIn);
    b.linear("indexer.wk", m.indexHeadDim, h);
    b.add("indexer.k_norm", "indexer.k_norm.weight", {m.indexHeadDim});
    b.add("indexer.k_norm.bias", "indexer.k_norm.bias", {m.indexHeadDim});
    b.linear("indexer.weights_proj", m.indexHeads, h);
  }
}

/// Gated DeltaNet; \p split selects Qwen3.5's split input projections.
void declareGatedDeltaNet(const ModelSpec &spec, const MixerSpec &m,
                          ComponentBuilder &b, bool split) {
  int64_t h = spec.hidden;
  int64_t keyDim = m.linearKeyHeads * m.linearKeyDim;
  int64_t valueDim = m.linearValueHeads * m.linearValueDim;
  if (split) {
    b.linear("in_proj_qkv", 2 * keyDim + valueDim, h);
    b.linear("in_proj_z", valueDim, h);
    b.linear("in_proj_b", m.linearValueHeads, h);
    b.linear("in_proj_a", m.linearValueHeads, h);
  } else {
    b.linear("in_proj_qkvz", 2 * keyDim + 2 * valueDim, h);
    b.linear("in_proj_ba", 2 * m.linearValueHeads, h);
  }
  b.add("conv1d", "conv1d.weight", {2 * keyDim + valueDim, 1, m.convKernel});
  b.add("dt_bias", "dt_bias", {m.linearValueHeads});
  b.add("A_log", "A_log", {m.linearValueHeads});
  b.add("norm", "norm.weight", {m.linearValueDim});
  b.linear("out_proj", h, valueDim);
}

/// Kimi Delta Attention.
void declareKimiDelta(const ModelSpec &spec, const MixerSpec &m,
                      ComponentBuilder &b) {
  int64_t h = spec.hidden;
  int64_t d = m.linearKeyDim;
  int64_t width = m.linearKeyHeads * d;
  b.linear("q_proj", width, h);
  b.linear("k_proj", width, h);
  b.linear("v_proj", width, h);
  for (const char *conv : {"q_conv1d", "k_conv1d", "v_conv1d"})
    b.add(conv, std::string(conv) + ".weight", {width, 1, m.convKernel});
  b.linear("f_a_proj", d, h);
  b.linear("f_b_proj", width, d);
  b.linear("b_proj", m.linearKeyHeads, h);
  b.linear("g_a_proj", d, h);
  b.linear("g_b_proj", width, d);
  // [1, 1, H, 1], as transformers' KimiLinearForgetGate holds it (its
  // checkpoint conversion renames A_log without reshaping).
  b.add("A_log", "A_log", {1, 1, m.linearKeyHeads, 1});
  b.add("dt_bias", "dt_bias", {width});
  b.add("o_norm", "o_norm.weight", {d});
  b.linear("o_proj", h, width);
}

/// MiniMax lightning attention.
void declareLightning(const ModelSpec &spec, const MixerSpec &m,
                      ComponentBuilder &b) {
  int64_t h = spec.hidden;
  int64_t width = m.numHeads * m.headDim;
  b.linear("qkv_proj", 3 * width, h);
  b.linear("output_gate", width, h);
  b.add("norm", "norm.weight", {width});
  b.linear("out_proj", h, width);
}

/// The name of the feed-forward module for the family.
std::string ffnModule(const ModelSpec &spec, bool moe) {
  if (isFamily(spec, {"mixtral", "minimax_m1", "minimax_m2", "kimi_linear"}))
    return moe ? "block_sparse_moe." : "mlp.";
  if (spec.family == "llama4")
    return "feed_forward.";
  return "mlp.";
}

/// A gated (SwiGLU) MLP with the family's projection names.
void declareGatedMlp(const ModelSpec &spec, ComponentBuilder &b,
                     const std::string &module, int64_t width) {
  int64_t h = spec.hidden;
  b.linear(module + "gate_proj", width, h);
  b.linear(module + "up_proj", width, h);
  b.linear(module + "down_proj", h, width);
}

/// Router, routed experts and shared experts.
void declareMoe(const ModelSpec &spec, const FfnSpec &f, ComponentBuilder &b) {
  int64_t h = spec.hidden, e = f.numExperts, w = f.expertIntermediate;
  if (spec.family == "gpt_oss") {
    b.linear("router", e, h, /*bias=*/true);
    b.fusedExperts("experts.gate_up_proj", "experts.gate_up_proj",
                   {e, 2 * w, h}, true);
    b.fusedExperts("experts.gate_up_proj_bias", "experts.gate_up_proj_bias",
                   {e, 2 * w}, false);
    b.fusedExperts("experts.down_proj", "experts.down_proj", {e, h, w}, true);
    b.fusedExperts("experts.down_proj_bias", "experts.down_proj_bias", {e, h},
                   false);
    return;
  }
  if (spec.family == "llama4") {
    // Logical [E, out, in] like every linear; stored [E, in, out] (see
    // expandToDisk).
    b.linear("router", e, h);
    b.fusedExperts("experts.gate_up_proj", "experts.gate_up_proj",
                   {e, 2 * w, h}, true);
    b.fusedExperts("experts.down_proj", "experts.down_proj", {e, h, w}, true);
    declareGatedMlp(spec, b, "shared_expert.", f.sharedIntermediate);
    return;
  }
  if (f.fusedLayout == "concat_in_out_converted") {
    // Qwen3-VL-MoE: a plain router and fused experts, stored [E, in, out]
    // (see expandToDisk) like Llama-4's.
    b.add("gate", "gate.weight", {e, h}, true);
    b.fusedExperts("experts.gate_up_proj", "experts.gate_up_proj",
                   {e, 2 * w, h}, true);
    b.fusedExperts("experts.down_proj", "experts.down_proj", {e, h, w}, true);
    return;
  }
  bool mixtralNames = isFamily(spec, {"mixtral", "minimax_m1", "minimax_m2", "kimi_linear"});
  b.add("gate", spec.family == "hunyuan" ? "gate.wg.weight" : "gate.weight",
        {e, h}, true);
  if (f.correctionBias)
    b.add("e_score_correction_bias",
          spec.family == "minimax_m2" ? "e_score_correction_bias"
                                      : "gate.e_score_correction_bias",
          {e});
  if (mixtralNames) {
    b.perExpert("experts.w1", "experts.{e}.w1.weight", {w, h}, e);
    b.perExpert("experts.w2", "experts.{e}.w2.weight", {h, w}, e);
    b.perExpert("experts.w3", "experts.{e}.w3.weight", {w, h}, e);
  } else {
    b.perExpert("experts.gate_proj", "experts.{e}.gate_proj.weight", {w, h}, e);
    b.perExpert("experts.up_proj", "experts.{e}.up_proj.weight", {w, h}, e);
    b.perExpert("experts.down_proj", "experts.{e}.down_proj.weight", {h, w}, e);
  }
  if (f.numShared > 0 && f.sharedIntermediate > 0) {
    int64_t width = f.sharedIntermediate * f.numShared;
    if (f.sharedGate || spec.family == "qwen3_next") {
      declareGatedMlp(spec, b, "shared_expert.", width);
      b.linear("shared_expert_gate", 1, h);
    } else if (spec.family == "hunyuan") {
      declareGatedMlp(spec, b, "shared_mlp.", width);
    } else {
      declareGatedMlp(spec, b, "shared_experts.", width);
    }
  }
}

/// One decoder layer's mixer, norms and FFN under \p layerPrefix.
void declareLayer(const ModelSpec &spec, const LayerSpec &layer,
                  const std::string &layerPrefix, int64_t componentLayer,
                  const NameProbe &probe, std::vector<ComponentDecl> &out) {
  const MixerSpec &m = layer.mixer;
  {
    ComponentBuilder norms(out, "norm", componentLayer, layerPrefix);
    norms.add("input_layernorm", "input_layernorm.weight", {spec.hidden});
    norms.add("post_attention_layernorm", "post_attention_layernorm.weight",
              {spec.hidden});
  }
  // Qwen3-Next keeps its Gated DeltaNet tensors under linear_attn.; every
  // other mixer sits under self_attn.
  const std::string mixerPrefix =
      layerPrefix + (m.kind == MixerKind::GatedDeltaNet ? "linear_attn." : "self_attn.");
  ComponentBuilder mixer(out, mixerKindName(m.kind), componentLayer, mixerPrefix);
  switch (m.kind) {
  case MixerKind::Attention: declareAttention(spec, m, mixer); break;
  case MixerKind::MLA: declareMla(spec, m, mixer); break;
  case MixerKind::GatedDeltaNet:
    declareGatedDeltaNet(spec, m, mixer, probe && probe(mixerPrefix + "in_proj_qkv.weight"));
    break;
  case MixerKind::KimiDelta: declareKimiDelta(spec, m, mixer); break;
  case MixerKind::Lightning: declareLightning(spec, m, mixer); break;
  }
  ComponentBuilder ffn(out, layer.ffn.isMoe ? "moe" : "mlp", componentLayer,
                       layerPrefix + ffnModule(spec, layer.ffn.isMoe));
  if (layer.ffn.isMoe)
    declareMoe(spec, layer.ffn, ffn);
  else
    declareGatedMlp(spec, ffn, "", layer.ffn.intermediate);
}

/// Multi-token-prediction modules: DeepSeek style (extra numbered layers
/// with their own embedding and head copies) or Qwen style (`mtp.*`).
void declareMtp(const ModelSpec &spec, const std::string &prefix,
                std::vector<ComponentDecl> &out) {
  if (spec.numMtpLayers <= 0 || spec.layers.empty())
    return;
  int64_t h = spec.hidden, n = spec.layers.size();
  // The MTP block copies the last layer's shape (a MoE layer).
  LayerSpec block = spec.layers.back();
  for (const LayerSpec &l : spec.layers)
    if (l.mixer.kind == MixerKind::Attention || l.mixer.kind == MixerKind::MLA)
      block.mixer = l.mixer;
  block.mixer.window = "none";
  bool qwenStyle = spec.family == "qwen3_next";
  for (int64_t k = 0; k < spec.numMtpLayers; ++k) {
    std::string lp = qwenStyle ? "mtp.layers." + std::to_string(k) + "."
                               : prefix + "layers." + std::to_string(n + k) + ".";
    size_t first = out.size();
    declareLayer(spec, block, lp, n + k, nullptr, out);
    ComponentBuilder extra(out, "mtp", n + k, "");
    if (qwenStyle) {
      extra.linear("mtp.fc", h, 2 * h);
      extra.add("pre_fc_norm_embedding", "mtp.pre_fc_norm_embedding.weight", {h});
      extra.add("pre_fc_norm_hidden", "mtp.pre_fc_norm_hidden.weight", {h});
      extra.add("norm", "mtp.norm.weight", {h});
    } else {
      extra.add("enorm", lp + "enorm.weight", {h});
      extra.add("hnorm", lp + "hnorm.weight", {h});
      extra.add("eh_proj", lp + "eh_proj.weight", {h, 2 * h}, true);
      extra.add("shared_head.norm", lp + "shared_head.norm.weight", {h});
      extra.add("embed_tokens", lp + "embed_tokens.weight", {spec.vocab, h});
      extra.add("shared_head.head", lp + "shared_head.head.weight",
                {spec.vocab, h});
    }
    // Fold the MTP block's layer components into the one mtp component.
    ComponentDecl merged{"mtp", n + k, {}};
    for (size_t i = first; i < out.size(); ++i)
      for (WeightDecl &w : out[i].weights)
        merged.weights.push_back(std::move(w));
    out.resize(first);
    out.push_back(std::move(merged));
  }
}

/// A ViT-style vision tower with patch merger and deepstack mergers.
void declareVision(const EncoderSpec &e, std::vector<ComponentDecl> &out) {
  ComponentBuilder b(out, "vision_encoder", -1, "model.visual.");
  int64_t h = e.hidden;
  b.add("patch_embed", "patch_embed.proj.weight",
        {h, e.inChannels, e.temporalPatch, e.patchSize, e.patchSize});
  b.add("patch_embed.bias", "patch_embed.proj.bias", {h});
  if (e.numPositions > 0)
    b.add("pos_embed", "pos_embed.weight", {e.numPositions, h});
  // Roles name the module inside its block or merger ("attn.qkv",
  // "merger.linear_fc1"), the same in every block: the registry's LoRA roles.
  auto linear = [&](const std::string &role, const std::string &name, int64_t outDim, int64_t inDim) {
    b.add(role, name + ".weight", {outDim, inDim}, true);
    b.add(role + ".bias", name + ".bias", {outDim});
  };
  for (int64_t i = 0; i < e.depth; ++i) {
    std::string p = "blocks." + std::to_string(i) + ".";
    for (std::string norm : {"norm1", "norm2"}) {
      b.add(norm, p + norm + ".weight", {h});
      b.add(norm + ".bias", p + norm + ".bias", {h});
    }
    linear("attn.qkv", p + "attn.qkv", 3 * h, h);
    linear("attn.proj", p + "attn.proj", h, h);
    linear("mlp.linear_fc1", p + "mlp.linear_fc1", e.intermediate, h);
    linear("mlp.linear_fc2", p + "mlp.linear_fc2", h, e.intermediate);
  }
  int64_t merged = h * e.spatialMerge * e.spatialMerge;
  auto merger = [&](const std::string &role, const std::string &p, int64_t normWidth) {
    b.add(role + "norm", p + "norm.weight", {normWidth});
    b.add(role + "norm.bias", p + "norm.bias", {normWidth});
    linear(role + "linear_fc1", p + "linear_fc1", merged, merged);
    linear(role + "linear_fc2", p + "linear_fc2", e.outHidden, merged);
  };
  merger("merger.", "merger.", h);
  for (size_t k = 0; k < e.deepstackLayers.size(); ++k)
    merger("deepstack_merger.", "deepstack_merger_list." + std::to_string(k) + ".", merged);
}

/// A Whisper-style audio encoder with a projector into the LLM.
void declareAudio(const EncoderSpec &e, std::vector<ComponentDecl> &out) {
  ComponentBuilder b(out, "audio_encoder", -1, "audio.");
  int64_t h = e.hidden;
  b.add("conv1", "conv1.weight", {h, e.inChannels, 3});
  b.add("conv1.bias", "conv1.bias", {h});
  b.add("conv2", "conv2.weight", {h, h, 3});
  b.add("conv2.bias", "conv2.bias", {h});
  for (int64_t i = 0; i < e.depth; ++i) {
    std::string p = "blocks." + std::to_string(i) + ".";
    b.linear(p + "attn.query", h, h, true);
    b.linear(p + "attn.key", h, h);
    b.linear(p + "attn.value", h, h, true);
    b.linear(p + "attn.out", h, h, true);
    b.linear(p + "mlp.0", e.intermediate, h, true);
    b.linear(p + "mlp.2", h, e.intermediate, true);
    for (const char *norm : {"attn_ln", "mlp_ln"}) {
      b.add(p + norm, p + norm + ".weight", {h});
      b.add(p + norm + ".bias", p + norm + ".bias", {h});
    }
  }
  b.add("ln_post", "ln_post.weight", {h});
  b.add("ln_post.bias", "ln_post.bias", {h});
  b.linear("projector", e.outHidden, h, true);
}

/// The decoder's tensor-name prefix: the manifest decides among the layouts
/// multimodal releases use; without one, the config's nesting does.
std::string chooseDecoderPrefix(const ModelSpec &spec, const NameProbe &probe) {
  if (probe)
    for (const char *candidate :
         {"model.", "model.language_model.", "language_model.model.",
          "model.model.", "language_model."})
      if (probe(std::string(candidate) + "embed_tokens.weight"))
        return candidate;
  if (spec.family == "llama4" && spec.weightPrefix != "model.")
    return "language_model.model.";
  return spec.weightPrefix;
}

} // namespace

void refineWithManifest(ModelSpec &spec, const NameProbe &probe) {
  if (!probe)
    return;
  std::string prefix = chooseDecoderPrefix(spec, probe);
  for (Assumption &a : spec.assumptions) {
    if (a.confirmBy.rfind(spec.weightPrefix, 0) == 0)
      a.confirmBy = prefix + a.confirmBy.substr(spec.weightPrefix.size());
    a.status = probe(a.confirmBy) ? "confirmed" : "contradicted";
  }
  for (LayerSpec &layer : spec.layers) {
    std::string attn = prefix + "layers." + std::to_string(layer.index) + ".self_attn.";
    // Qwen3-style QK-norm is not spelled in the config; its tensors say so.
    if (layer.mixer.kind == MixerKind::Attention && !layer.mixer.qkNorm &&
        probe(attn + "q_norm.weight") && probe(attn + "k_norm.weight"))
      layer.mixer.qkNorm = true;
  }
}

std::vector<ComponentDecl> declareModel(const ModelSpec &spec,
                                        const NameProbe &probe) {
  std::vector<ComponentDecl> out;
  std::string prefix = chooseDecoderPrefix(spec, probe);
  std::string headPrefix =
      prefix.rfind("language_model.", 0) == 0 ? "language_model." : "";
  {
    ComponentBuilder b(out, "embedding", -1, prefix);
    b.add("embed_tokens", "embed_tokens.weight", {spec.vocab, spec.hidden});
  }
  for (const LayerSpec &layer : spec.layers)
    declareLayer(spec, layer, prefix + "layers." + std::to_string(layer.index) + ".",
                 layer.index, probe, out);
  {
    ComponentBuilder b(out, "norm", -1, prefix);
    b.add("norm", "norm.weight", {spec.hidden});
  }
  if (!spec.tieEmbeddings) {
    ComponentBuilder b(out, "lm_head", -1, headPrefix);
    b.linear("lm_head", spec.vocab, spec.hidden);
  }
  declareMtp(spec, prefix, out);
  for (const EncoderSpec &e : spec.encoders) {
    if (e.modality == "vision")
      declareVision(e, out);
    else
      declareAudio(e, out);
  }
  return out;
}

int64_t weightElements(const WeightDecl &weight) {
  int64_t n = 1;
  for (int64_t d : weight.shape)
    n *= d;
  return weight.experts > 0 ? n * weight.experts : n;
}

std::string safetensorsDtypeFor(const std::string &torchDtype) {
  if (torchDtype == "float16" || torchDtype == "half")
    return "F16";
  if (torchDtype == "float32" || torchDtype == "float")
    return "F32";
  return "BF16";
}

namespace {
/// Whether a module path is excluded from quantization by the config.
bool isExcluded(const std::string &name, const QuantSpec &quant) {
  for (const std::string &pattern : quant.excluded) {
    std::string core = pattern;
    if (core.rfind("re:", 0) == 0)
      core = core.substr(3);
    core.erase(std::remove(core.begin(), core.end(), '*'), core.end());
    core.erase(std::remove(core.begin(), core.end(), '\\'), core.end());
    std::string trimmed = core;
    for (const char *wild : {".", "^", "$"})
      while (!trimmed.empty() && trimmed.find(wild) == 0)
        trimmed = trimmed.substr(1);
    if (!trimmed.empty() && name.find(trimmed) != std::string::npos)
      return true;
  }
  return false;
}

std::string expertName(const std::string &name, int64_t expert) {
  std::string out = name;
  size_t pos = out.find("{e}");
  if (pos != std::string::npos)
    out.replace(pos, 3, std::to_string(expert));
  return out;
}
} // namespace

void expandToDisk(const WeightDecl &weight, int64_t expert,
                  const QuantSpec &quant, const std::string &dtype,
                  std::vector<DiskTensor> &out) {
  std::string name = expertName(weight.name, expert);
  const Shape &shape = weight.shape;
  bool quantizable = weight.linear && weight.role != "gate" &&
                     weight.role != "router" && weight.role != "lm_head" &&
                     !isExcluded(name, quant);
  auto ceilDiv = [](int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : a; };
  if (quantizable && quant.method == "fp8" && shape.size() == 2) {
    out.push_back({name, shape, "F8_E4M3"});
    std::string base = name.substr(0, name.size() - std::string("weight").size());
    out.push_back({base + "weight_scale_inv",
                   {ceilDiv(shape[0], quant.blockRows),
                    ceilDiv(shape[1], quant.blockCols)},
                   "F32"});
    return;
  }
  if (quantizable && quant.method == "mxfp4" && weight.routed &&
      shape.size() == 3) {
    // [E, out, in] → blocks [E, out, in/32, 16] and scales [E, out, in/32].
    int64_t groups = ceilDiv(shape[2], 32);
    out.push_back({name + "_blocks", {shape[0], shape[1], groups, 16}, "U8"});
    out.push_back({name + "_scales", {shape[0], shape[1], groups}, "U8"});
    return;
  }
  if (quantizable && quant.method == "nvfp4" && shape.size() == 2) {
    std::string base = name.substr(0, name.size() - std::string("weight").size());
    out.push_back({name, {shape[0], ceilDiv(shape[1], 2)}, "U8"});
    out.push_back({base + "weight_scale",
                   {shape[0], ceilDiv(shape[1], quant.groupSize > 0 ? quant.groupSize : 16)},
                   "F8_E4M3"});
    out.push_back({base + "weight_scale_2", {}, "F32"});
    out.push_back({base + "input_scale", {}, "F32"});
    return;
  }
  if (quantizable && quant.method == "compressed-tensors" && quant.bits > 0 &&
      shape.size() == 2) {
    std::string base = name.substr(0, name.size() - std::string("weight").size());
    int64_t perWord = 32 / quant.bits;
    out.push_back({base + "weight_packed", {shape[0], ceilDiv(shape[1], perWord)}, "I32"});
    out.push_back({base + "weight_scale",
                   {shape[0], ceilDiv(shape[1], quant.groupSize > 0 ? quant.groupSize : 1)},
                   "BF16"});
    out.push_back({base + "weight_shape", {2}, "I32"});
    return;
  }
  if (weight.linear && weight.routed && weight.experts == 0 &&
      shape.size() == 3) {
    // Fused expert matmuls (gpt-oss, Llama-4) are stored unquantized as
    // [E, in, out], the layout transformers multiplies with (x @ W[e]); the
    // logical shape is [E, out, in] like every linear, and the MXFP4 blocks
    // above keep that order.
    out.push_back({name, {shape[0], shape[2], shape[1]}, dtype});
    return;
  }
  out.push_back({name, shape, dtype});
}

} // namespace adapt
