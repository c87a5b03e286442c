//===- ConfigReader.cpp - config.json into a ModelSpec --------------------===//
//
// Recognition is by features: each rule looks for the keys that define a
// component (kv_lora_rank → MLA, linear_key_head_dim → gated delta rule,
// index_topk → sparse attention, ...) under every spelling the released
// families use. The family name chosen at the end only selects the weight
// naming scheme; an unseen model_type with known keys maps onto the IR.
//
//===----------------------------------------------------------------------===//

#include "parser/ConfigReader.h"
#include "parser/MessageText.h"
#include "parser/ConfigKeys.h"
#include "parser/SizeLimits.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <sys/stat.h>

using nlohmann::json;

namespace adapt {

const char *mixerKindName(MixerKind kind) {
  switch (kind) {
  case MixerKind::Attention: return "attention";
  case MixerKind::MLA: return "mla";
  case MixerKind::GatedDeltaNet: return "gated_delta_net";
  case MixerKind::KimiDelta: return "kimi_delta";
  case MixerKind::Lightning: return "lightning";
  }
  return "unknown";
}

namespace {

/// Released configs are a few KB (the largest in ../shared/models: 12 KB);
/// anything past this is not a config, and reading it would only cost memory.
constexpr uint64_t kMaxConfigBytes = 16u << 20;
/// Released configs nest 3 deep (text_config.rope_scaling.mrope_section);
/// deeper input is refused before any recursive code sees it.
constexpr int kMaxConfigDepth = 64;

/// Why a file could not be read as a config, or "" when \p out holds it.
/// Refuses special files (a FIFO or /dev/zero would block or never end) and
/// files larger than kMaxConfigBytes, before reading a byte.
std::string readWholeFile(const std::string &path, std::string &out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return "expected a readable config.json file";
  if (!S_ISREG(st.st_mode))
    return "expected a regular file, not a device, FIFO or folder";
  if (static_cast<uint64_t>(st.st_size) > kMaxConfigBytes)
    return "expected at most " + std::to_string(kMaxConfigBytes >> 20) + " MiB (configs are a few KB), got " +
           std::to_string(st.st_size) + " bytes";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return "expected a readable config.json file";
  std::ostringstream buffer;
  buffer << in.rdbuf();
  out = buffer.str();
  return "";
}

/// Thrown by the parser callback past kMaxConfigDepth.
struct TooDeep {
  size_t depth;
};

/// Parses JSON text; a syntax error becomes an InputError with the position,
/// nesting past kMaxConfigDepth one that says so.
json parseJsonOrFail(std::string_view text, const std::string &file) {
  try {
    return json::parse(text.begin(), text.end(), [](int depth, json::parse_event_t, json &) {
      if (depth > kMaxConfigDepth)
        throw TooDeep{static_cast<size_t>(depth)};
      return true;
    });
  } catch (const TooDeep &) {
    throw ConfigError{InputError{file, "JSON nesting",
                                 "expected at most " + std::to_string(kMaxConfigDepth) +
                                     " nested objects/arrays (configs nest 3 deep)"}};
  } catch (const json::parse_error &e) {
    std::string what = e.what();
    auto pos = what.find("parse error");
    throw ConfigError{InputError{
        file, "byte " + std::to_string(e.byte),
        "expected valid JSON: " +
            printable(withoutQuotedInput(pos == std::string::npos ? what : what.substr(pos)),
                      300, /*asciiOnly=*/true)}};
  }
}

/// Reads rope_scaling / rope_parameters and the top-level rope keys.
RopeSpec readRope(ConfigObject &cfg, int64_t headDim) {
  RopeSpec rope;
  cfg.readDouble({"rope_theta"}, rope.theta);
  cfg.readDouble({"partial_rotary_factor"}, rope.partialFactor);
  if (auto rotaryDim = cfg.getInt({"rotary_dim"}); rotaryDim && headDim > 0)
    rope.partialFactor = double(*rotaryDim) / double(headDim);
  for (const char *key : {"rope_scaling", "rope_parameters"}) {
    std::optional<ConfigObject> scaling = cfg.getObject(key);
    if (!scaling)
      continue;
    scaling->readString({"rope_type", "type"}, rope.type);
    scaling->readDouble({"rope_theta"}, rope.theta);
    scaling->readDouble({"factor"}, rope.factor);
    scaling->readDouble({"partial_rotary_factor"}, rope.partialFactor);
    scaling->readInt({"original_max_position_embeddings"}, rope.originalMaxPositions);
    if (auto alpha = scaling->getDouble({"alpha"})) {
      // Hunyuan: "dynamic" with alpha is NTK-alpha scaling.
      rope.type = "ntk_alpha";
      rope.factor = *alpha;
    }
    if (scaling->has({"mrope_section"})) {
      rope.type = "mrope";
      if (auto section = scaling->getIntList({"mrope_section"}))
        rope.mropeSection = *section;
    }
    scaling->readDouble({"beta_fast"}, rope.betaFast);
    scaling->readDouble({"beta_slow"}, rope.betaSlow);
    scaling->readDouble({"mscale"}, rope.mscale);
    scaling->readDouble({"mscale_all_dim"}, rope.mscaleAllDim);
    scaling->readBool({"truncate"}, rope.truncate);
    scaling->readDouble({"low_freq_factor"}, rope.lowFreqFactor);
    scaling->readDouble({"high_freq_factor"}, rope.highFreqFactor);
    scaling->markRead({"mrope_section", "mrope_interleaved"});
  }
  cfg.readBool({"rope_interleave"}, rope.interleaved);
  if (auto useRope = cfg.getBool({"use_rotary_pos_emb"}); useRope && !*useRope)
    rope.type = "none";
  return rope;
}

/// The layer_types values this reader understands.
bool isKnownLayerType(const std::string &type) {
  return type == "full_attention" || type == "sliding_attention" || type == "linear_attention" ||
         type == "chunked_attention";
}

/// The token mixer of each layer, from whichever layer-pattern key exists.
std::vector<std::string> readLayerPattern(ConfigObject &cfg,
                                          int64_t numLayers) {
  std::vector<std::string> pattern(numLayers, "full_attention");
  if (auto types = cfg.getStringList({"layer_types"})) {
    if ((int64_t)types->size() != numLayers)
      cfg.fail("layer_types", "expected " + std::to_string(numLayers) +
                                  " entries (num_hidden_layers), found " +
                                  std::to_string(types->size()));
    // An unseen entry is read as full attention (its parameters counted
    // from the head sizes) and reported as a missing component by the
    // caller (unseenLayerType).

    if (auto interval = cfg.getInt({"full_attention_interval"}))
      for (int64_t i = 0; i < numLayers; ++i)
        if (*interval > 0 && isKnownLayerType((*types)[i]) && ((i + 1) % *interval == 0) !=
                                 ((*types)[i] == "full_attention"))
          cfg.fail("layer_types[" + std::to_string(i) + "]",
                   "expected the pattern of full_attention_interval = " +
                       std::to_string(*interval) + ", found \"" +
                       (*types)[i] + "\"");
    return *types;
  }
  if (auto list = cfg.getIntList({"attn_type_list"})) {
    if ((int64_t)list->size() != numLayers)
      cfg.fail("attn_type_list", "expected " + std::to_string(numLayers) +
                                     " entries, found " +
                                     std::to_string(list->size()));
    for (int64_t i = 0; i < numLayers; ++i)
      pattern[i] = (*list)[i] == 1 ? "full_attention" : "linear_attention";
    return pattern;
  }
  if (auto interval = cfg.getInt({"full_attention_interval"})) {
    if (*interval < 1)
      cfg.fail("full_attention_interval", "expected an integer >= 1");
    for (int64_t i = 0; i < numLayers; ++i)
      pattern[i] = (i + 1) % *interval == 0 ? "full_attention"
                                             : "linear_attention";
    return pattern;
  }
  if (std::optional<ConfigObject> linear = cfg.getObject("linear_attn_config")) {
    // Kimi-Linear lists 1-based layer numbers.
    auto kda = linear->getIntList({"kda_layers"}).value_or(
        std::vector<int64_t>{});
    auto full = linear->getIntList({"full_attn_layers"}).value_or(
        std::vector<int64_t>{});
    for (int64_t layer : kda) {
      if (layer < 1 || layer > numLayers)
        linear->fail("kda_layers", "expected 1-based layer numbers in 1.." +
                                       std::to_string(numLayers) + ", found " +
                                       std::to_string(layer));
      pattern[layer - 1] = "linear_attention";
    }
    for (int64_t layer : full)
      if (layer < 1 || layer > numLayers)
        linear->fail("full_attn_layers",
                     "expected 1-based layer numbers in 1.." +
                         std::to_string(numLayers));
    linear->markRead({"head_dim", "num_heads", "short_conv_kernel_size"});
    return pattern;
  }
  return pattern;
}

/// Which layers use a mixture of experts, from every pattern key in use.
std::vector<bool> readMoePattern(ConfigObject &cfg, int64_t numLayers,
                                 bool hasExperts) {
  std::vector<bool> moe(numLayers, hasExperts);
  if (!hasExperts)
    return moe;
  int64_t firstDense = cfg.getInt({"first_k_dense_replace"}).value_or(0);
  int64_t freq = cfg.getInt({"moe_layer_freq"}).value_or(1);
  int64_t sparseStep = cfg.getInt({"decoder_sparse_step"}).value_or(1);
  int64_t interleave = cfg.getInt({"interleave_moe_layer_step"}).value_or(1);
  if (freq < 1 || sparseStep < 1 || interleave < 1)
    cfg.fail("moe_layer_freq", "expected layer steps >= 1");
  std::set<int64_t> mlpOnly;
  if (auto list = cfg.getIntList({"mlp_only_layers"}))
    mlpOnly.insert(list->begin(), list->end());
  for (int64_t i = 0; i < numLayers; ++i)
    moe[i] = i >= firstDense && i % freq == 0 && (i + 1) % sparseStep == 0 &&
             (i + 1) % interleave == 0 && !mlpOnly.count(i);
  return moe;
}

/// Fills the attention-side fields shared by every layer.
MixerSpec readAttention(ConfigObject &cfg, int64_t hidden) {
  MixerSpec m;
  m.numHeads = cfg.requireInt({"num_attention_heads", "n_head"});
  m.numKvHeads = cfg.getInt({"num_key_value_heads", "num_kv_heads"})
                     .value_or(m.numHeads);
  if (m.numKvHeads < 1 || m.numHeads % m.numKvHeads != 0)
    cfg.fail("num_key_value_heads",
             "expected a divisor of num_attention_heads (" +
                 std::to_string(m.numHeads) + "), found " +
                 std::to_string(m.numKvHeads));
  m.headDim = cfg.getInt({"head_dim", "attention_head_dim"})
                  .value_or(hidden / m.numHeads);
  m.vHeadDim = m.headDim;
  bool mla = cfg.has({"kv_lora_rank"});
  if (auto useMla = cfg.getBool({"use_mla"}); useMla && !*useMla)
    mla = false;
  if (mla) {
    m.kind = MixerKind::MLA;
    m.kvLoraRank = cfg.requireInt({"kv_lora_rank"});
    m.qLoraRank = cfg.getInt({"q_lora_rank"}).value_or(0);
    m.qkNopeDim = cfg.requireInt({"qk_nope_head_dim"});
    m.qkRopeDim = cfg.requireInt({"qk_rope_head_dim"}, 0);
    m.vHeadDim = cfg.requireInt({"v_head_dim"});
    m.headDim = m.qkNopeDim + m.qkRopeDim;
    if (auto qk = cfg.getInt({"qk_head_dim"}); qk && *qk != m.headDim)
      cfg.fail("qk_head_dim", "expected qk_nope_head_dim + qk_rope_head_dim = " +
                                  std::to_string(m.headDim));
    m.numKvHeads = m.numHeads;
  } else {
    cfg.markRead({"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim"});
  }
  bool bias = cfg.getBool({"attention_bias", "qkv_bias", "use_qkv_bias"})
                  .value_or(false);
  m.qkvBias = bias;
  m.outBias = cfg.getBool({"attention_bias"}).value_or(false);
  std::optional<std::string> qkNormType = cfg.getString({"qk_norm_type"});
  m.qkNorm = cfg.getBool({"use_qk_norm"}).value_or(false) || qkNormType;
  // MiniMax-M2's "per_layer" norms q and k over all heads at once.
  if (qkNormType && *qkNormType == "per_layer")
    m.qkNormKind = "full";
  m.outputGate = cfg.getBool({"attn_output_gate"}).value_or(false);
  m.rope = readRope(cfg, m.kind == MixerKind::MLA ? m.qkRopeDim : m.headDim);
  if (m.kind == MixerKind::MLA && cfg.getBool({"mla_use_nope"}).value_or(false))
    m.rope.type = "none";
  if (m.kind == MixerKind::MLA) {
    // DeepSeek rotates adjacent pairs (transformers' rope_interleave, on by
    // default for MLA) and folds YaRN's mscale_all_dim into the softmax scale.
    m.rope.interleaved = cfg.getBool({"rope_interleave"}).value_or(true);
    if (m.rope.mscaleAllDim != 0 && m.rope.factor > 1) {
      double mscale = 0.1 * m.rope.mscaleAllDim * std::log(m.rope.factor) + 1.0;
      m.softmaxScale = mscale * mscale / std::sqrt(double(m.headDim));
    }
  }
  // Llama-4's attention temperature tuning (its NoPE layers only); the
  // config class defaults apply when the keys are absent.
  if (const nlohmann::json *tuning = cfg.raw("attn_temperature_tuning"))
    m.temperatureTuning = tuning->is_boolean() ? tuning->get<bool>()
                          : tuning->is_number() ? tuning->get<double>() != 0
                                                : true;
  else
    m.temperatureTuning = true;
  cfg.readDouble({"floor_scale"}, m.floorScale);
  cfg.readDouble({"attn_scale"}, m.attnScale);
  if (auto topK = cfg.getInt({"index_topk"})) {
    m.indexTopK = *topK;
    m.indexHeads = cfg.requireInt({"index_n_heads"});
    m.indexHeadDim = cfg.requireInt({"index_head_dim"});
    // transformers fixes the indexer's RoPE layout per model class, whatever
    // this key says (set by model_type in readModelSpec).
    cfg.markRead({"indexer_rope_interleave"});
  }
  return m;
}

/// GLM-MoE-DSA's per-layer indexer kinds, as transformers derives them:
/// indexer_types, else index_topk_pattern ("FSSF..." or a list), else
/// index_topk_freq with index_skip_topk_offset (default 2). "full" runs the
/// layer's own indexer, "shared" reuses the previous full layer's top-k; any
/// other value stays as written (an unseen kind for the caller).
std::vector<std::string> readIndexerTypes(ConfigObject &cfg, int64_t numLayers) {
  std::vector<std::string> types;
  if (auto list = cfg.getStringList({"indexer_types"})) {
    types = *list;
  } else if (const nlohmann::json *pattern = cfg.raw("index_topk_pattern")) {
    if (pattern->is_string()) {
      for (char c : pattern->get<std::string>())
        types.push_back(c == 'F' ? "full" : c == 'S' ? "shared" : std::string(1, c));
    } else if (auto listed = cfg.getStringList({"index_topk_pattern"})) {
      types = *listed;
    }
  } else {
    const int64_t freq = std::max<int64_t>(cfg.getInt({"index_topk_freq"}).value_or(1), 1);
    const int64_t offset = cfg.getInt({"index_skip_topk_offset"}).value_or(2);
    for (int64_t i = 0; i < numLayers; ++i)
      types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  cfg.markRead({"indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset"});
  if (static_cast<int64_t>(types.size()) != numLayers)
    cfg.fail("indexer_types", "expected one entry per layer (num_hidden_layers = " + std::to_string(numLayers) +
                                  "), found " + std::to_string(types.size()));
  if (!types.empty() && types.front() == "shared")
    cfg.fail("indexer_types", "expected the first layer to run its own indexer (\"full\"): a \"shared\" "
                              "layer reuses the top-k of an earlier full layer");
  return types;
}

/// MoE settings common to every MoE layer (per-layer lists are resolved by
/// the caller).
FfnSpec readMoe(ConfigObject &cfg, int64_t numExperts) {
  FfnSpec f;
  f.isMoe = true;
  f.numExperts = numExperts;
  std::string act = cfg.getString({"hidden_act"}).value_or("silu");
  f.activation = act;
  cfg.readString({"scoring_func", "moe_router_activation_func"}, f.scoring);
  // Any other scoring is kept: no registry variant matches it, so the
  // report calls the MoE missing and names the value.

  f.groups = cfg.getInt({"n_group", "num_expert_group"}).value_or(1);
  f.topKGroups = cfg.getInt({"topk_group"}).value_or(f.groups);
  if (f.groups < 1 || numExperts % f.groups != 0)
    cfg.fail("n_group", "expected a divisor of the expert count " +
                            std::to_string(numExperts));
  // Configs that copy DeepSeek-V3's router keys (n_routed_experts, n_group,
  // routed_scaling_factor) without spelling its method get its router:
  // GLM-4.5 has no scoring_func/topk_method, and transformers' Glm4Moe router
  // is DeepSeek-V3's (sigmoid, aux-loss-free e_score_correction_bias).
  bool deepseekRouter =
      !cfg.has({"scoring_func", "moe_router_activation_func", "topk_method"}) &&
      cfg.has({"n_routed_experts"}) && cfg.has({"n_group"}) &&
      cfg.has({"routed_scaling_factor"});
  if (deepseekRouter)
    f.scoring = "sigmoid";
  std::string topkMethod =
      cfg.getString({"topk_method"}).value_or(deepseekRouter ? "noaux_tc" : "");
  static const std::set<std::string> knownTopkMethods = {"", "greedy", "group_limited_greedy", "noaux_tc"};
  if (!knownTopkMethods.count(topkMethod))
    f.unseen.push_back("topk_method = \"" + printable(topkMethod, 80) + "\"");
  f.correctionBias = topkMethod == "noaux_tc" ||
                     cfg.getBool({"use_routing_bias"}).value_or(false) ||
                     cfg.getBool({"use_moe_router_bias"}).value_or(false) ||
                     cfg.getBool({"use_expert_bias"}).value_or(false);
  cfg.markRead({"use_grouped_topk"});
  f.normTopK =
      cfg.getBool({"norm_topk_prob", "moe_renormalize"}).value_or(false);
  f.routedScaling = cfg.getDouble({"routed_scaling_factor",
                                   "moe_router_scaling_factor",
                                   "moe_router_topk_scaling_factor"})
                        .value_or(1.0);
  cfg.readDouble({"swiglu_limit"}, f.swigluLimit);
  cfg.markRead({"router_type", "shared_moe_mode"});
  return f;
}

/// Vision and audio towers, coarse.
void readEncoders(ConfigObject &root, ModelSpec &spec) {
  if (std::optional<ConfigObject> v = root.getObject("vision_config")) {
    EncoderSpec e;
    e.modality = "vision";
    e.type = v->getString({"model_type"}).value_or("vision");
    e.depth = v->requireInt({"depth", "vt_num_hidden_layers", "num_hidden_layers"});
    e.hidden = v->requireInt({"hidden_size", "vt_hidden_size", "embed_dim"});
    e.intermediate = v->requireInt({"intermediate_size", "vt_intermediate_size"});
    e.numHeads = v->requireInt({"num_heads", "vt_num_attention_heads",
                                "num_attention_heads"});
    e.patchSize = v->requireInt({"patch_size"});
    e.temporalPatch = v->getInt({"temporal_patch_size"}).value_or(1);
    e.inChannels = v->getInt({"in_channels"}).value_or(3);
    e.spatialMerge = v->getInt({"spatial_merge_size"}).value_or(1);
    if (auto merge = v->getIntList({"merge_kernel_size"}); merge && !merge->empty())
      e.spatialMerge = (*merge)[0];
    e.numPositions = v->getInt({"num_position_embeddings"}).value_or(0);
    if (auto h = v->getInt({"init_pos_emb_height"}))
      e.numPositions = *h * v->getInt({"init_pos_emb_width"}).value_or(*h);
    e.outHidden = v->getInt({"out_hidden_size", "text_hidden_size"})
                      .value_or(spec.hidden);
    e.deepstackLayers =
        v->getIntList({"deepstack_visual_indexes"}).value_or(
            std::vector<int64_t>{});
    e.activation = v->getString({"hidden_act"}).value_or("");
    e.imageTokenId = root.getInt({"image_token_id"}).value_or(-1);
    if (std::optional<ConfigObject> rope = v->getObject("rope_parameters"))
      e.ropeTheta = rope->getDouble({"rope_theta"}).value_or(e.ropeTheta);
    v->markRead({"hidden_act", "mm_hidden_size", "mm_projector_type",
                 "projector_hidden_act", "merge_type", "pos_emb_type",
                 "init_pos_emb_time", "init_pos_emb_width",
                 "video_attn_type"});
    v->collectUnknown(spec.unknownKeys);
    spec.encoders.push_back(e);
  }
  if (std::optional<ConfigObject> a = root.getObject("audio_config")) {
    EncoderSpec e;
    e.modality = "audio";
    e.type = "whisper";
    std::optional<ConfigObject> w = a->getObject("whisper_encoder_config");
    ConfigObject &src = w ? *w : *a;
    e.depth = src.requireInt({"n_layer", "num_hidden_layers", "encoder_layers"});
    e.hidden = src.requireInt({"n_state", "hidden_size", "d_model"});
    e.numHeads = src.requireInt({"n_head", "num_attention_heads",
                                 "encoder_attention_heads"});
    e.intermediate = 4 * e.hidden;
    e.inChannels = src.getInt({"n_mels", "num_mel_bins"}).value_or(80);
    e.numPositions = src.getInt({"n_ctx", "max_source_positions"}).value_or(0);
    e.outHidden = spec.hidden;
    e.patchSize = 3;
    src.markRead({"ds_kernel_size", "ds_stride"});
    a->markRead({"ds_kernel_size", "ds_stride"});
    if (w)
      w->collectUnknown(spec.unknownKeys);
    a->collectUnknown(spec.unknownKeys);
    spec.encoders.push_back(e);
  }
}

/// quantization_config (FP8 block, MXFP4, compressed-tensors) and NVFP4's
/// separate hf_quant_config.json.
void readQuantization(ConfigObject &cfg, std::string_view hfQuantJson,
                      const std::string &file, ModelSpec &spec) {
  if (std::optional<ConfigObject> q = cfg.getObject("quantization_config")) {
    spec.quant.method = q->getString({"quant_method"}).value_or("unknown");
    spec.quant.format = q->getString({"fmt", "format"}).value_or("");
    if (auto block = q->getIntList({"weight_block_size"}); block) {
      if (block->size() != 2)
        q->fail("weight_block_size", "expected [rows, cols]");
      spec.quant.blockRows = (*block)[0];
      spec.quant.blockCols = (*block)[1];
    }
    if (auto excluded = q->getStringList({"modules_to_not_convert", "ignore"}))
      spec.quant.excluded = *excluded;
    if (const json *groups = q->raw("config_groups")) {
      // compressed-tensors: take the first group's weight scheme.
      for (auto &group : groups->items()) {
        const json &w = group.value().value("weights", json());
        if (w.is_object()) {
          spec.quant.bits = w.value("num_bits", 0);
          spec.quant.groupSize = w.value("group_size", 0);
        }
        break;
      }
    }
    q->markRead({"activation_scheme", "scale_fmt", "kv_cache_scheme",
                 "quantization_status"});
    q->collectUnknown(spec.unknownKeys);
  }
  if (hfQuantJson.empty())
    return;
  std::string quantFile = file.substr(0, file.find_last_of('/') + 1) +
                          "hf_quant_config.json";
  json hf = parseJsonOrFail(hfQuantJson, quantFile);
  if (!hf.is_object() || !hf.contains("quantization") ||
      !hf["quantization"].is_object())
    throw ConfigError{InputError{quantFile, "quantization",
                                 "expected an object with quant_algo"}};
  const json &q = hf["quantization"];
  std::string algo = q.value("quant_algo", "");
  std::transform(algo.begin(), algo.end(), algo.begin(), ::tolower);
  spec.quant.method = algo;
  spec.quant.groupSize = q.value("group_size", 0);
  spec.quant.bits = algo == "nvfp4" ? 4 : 8;
  if (q.contains("exclude_modules") && q["exclude_modules"].is_array())
    for (const json &m : q["exclude_modules"])
      if (m.is_string())
        spec.quant.excluded.push_back(m.get<std::string>());
}

/// Builds the per-layer specs of the decoder.
void readDecoder(ConfigObject &cfg, ModelSpec &spec) {
  int64_t numLayers = cfg.requireInt({"num_hidden_layers", "num_layers"});
  if (numLayers > 100000)
    cfg.fail("num_hidden_layers", "expected at most 100000 layers");
  spec.hidden = cfg.requireInt({"hidden_size", "d_model"});
  spec.vocab = cfg.requireInt({"vocab_size"});
  spec.maxPositions =
      cfg.getInt({"max_position_embeddings", "model_max_length"}).value_or(0);
  spec.normEps = cfg.getDouble({"rms_norm_eps", "layer_norm_eps"}).value_or(1e-6);
  cfg.markRead({"norm_type", "hidden_act", "org_vocab_size"});
  cfg.readBool({"tie_word_embeddings"}, spec.tieEmbeddings);

  MixerSpec attention = readAttention(cfg, spec.hidden);
  std::vector<std::string> pattern = readLayerPattern(cfg, numLayers);

  // Linear-attention shapes.
  MixerSpec linear = attention;
  linear.rope.type = "none";
  linear.qkvBias = linear.outBias = linear.qkNorm = false;
  linear.indexTopK = 0;
  if (cfg.has({"linear_key_head_dim"})) {
    linear.kind = MixerKind::GatedDeltaNet;
    linear.linearKeyHeads = cfg.requireInt({"linear_num_key_heads"});
    linear.linearValueHeads = cfg.requireInt({"linear_num_value_heads"});
    linear.linearKeyDim = cfg.requireInt({"linear_key_head_dim"});
    linear.linearValueDim = cfg.requireInt({"linear_value_head_dim"});
    linear.convKernel = cfg.getInt({"linear_conv_kernel_dim"}).value_or(4);
  } else if (std::optional<ConfigObject> kda =
                 cfg.getObject("linear_attn_config")) {
    linear.kind = MixerKind::KimiDelta;
    linear.linearKeyHeads = linear.linearValueHeads =
        kda->requireInt({"num_heads"});
    linear.linearKeyDim = linear.linearValueDim = kda->requireInt({"head_dim"});
    linear.convKernel = kda->getInt({"short_conv_kernel_size"}).value_or(4);
  } else {
    // MiniMax-M1 style lightning attention: same heads as softmax layers.
    linear.kind = MixerKind::Lightning;
    linear.outputGate = true;
    linear.blockSize = cfg.getInt({"block_size"}).value_or(256);
    if (linear.blockSize < 1)
      cfg.fail("block_size", "expected a block length >= 1");
  }

  // Windows.
  int64_t slidingWindow = cfg.getInt({"sliding_window"}).value_or(0);
  int64_t chunk = cfg.getInt({"attention_chunk_size"}).value_or(0);
  bool useSliding = cfg.getBool({"use_sliding_window"}).value_or(true);
  cfg.markRead({"max_window_layers"});

  // Experts.
  std::optional<int64_t> numExperts =
      cfg.getInt({"n_routed_experts", "num_experts", "num_local_experts"});
  bool hasExperts = numExperts && *numExperts > 1;
  std::vector<bool> moe = readMoePattern(cfg, numLayers, hasExperts);
  FfnSpec moeSpec;
  std::vector<int64_t> topKs, expertWidths, sharedCounts;
  if (hasExperts) {
    moeSpec = readMoe(cfg, *numExperts);
    std::optional<std::vector<int64_t>> perToken =
        cfg.getIntList({"num_experts_per_tok", "experts_per_token",
                        "num_experts_per_token", "moe_topk"},
                       numLayers);
    if (!perToken)
      cfg.fail("num_experts_per_tok", "required key missing: expected the "
                                      "number of experts per token");
    topKs = *perToken;
  }
  // Dense and expert widths. Mixtral, gpt-oss, MiniMax and Llama-4 use
  // intermediate_size for the experts.
  std::optional<int64_t> denseWidth = cfg.getInt({"intermediate_size_mlp"});
  std::optional<std::vector<int64_t>> moeWidth =
      cfg.getIntList({"moe_intermediate_size"}, numLayers);
  bool anyDense = std::find(moe.begin(), moe.end(), false) != moe.end();
  int64_t intermediate =
      anyDense || !moeWidth
          ? cfg.requireInt({"intermediate_size", "ffn_hidden_size"})
          : cfg.getInt({"intermediate_size", "ffn_hidden_size"}).value_or(0);
  if (hasExperts) {
    expertWidths = moeWidth ? *moeWidth
                            : std::vector<int64_t>(numLayers, intermediate);
    if (auto shared = cfg.getIntList({"n_shared_experts", "num_shared_experts",
                                      "num_shared_expert"},
                                     numLayers))
      sharedCounts = *shared;
    else
      sharedCounts.assign(numLayers, 0);
    if ((int64_t)topKs.size() != numLayers ||
        (int64_t)expertWidths.size() != numLayers ||
        (int64_t)sharedCounts.size() != numLayers)
      cfg.fail("moe_topk", "expected per-layer lists of num_hidden_layers (" +
                               std::to_string(numLayers) + ") entries");
  }
  std::optional<int64_t> sharedWidth =
      cfg.getInt({"shared_expert_intermediate_size", "shared_intermediate_size",
                  "share_expert_dim"});
  bool llama4 = cfg.has({"interleave_moe_layer_step"}) || chunk > 0;
  // Llama-4: no_rope_layers[i] = 1 means layer i uses RoPE (and is chunked);
  // absent, every fourth layer is a global NoPE layer.
  std::optional<std::vector<int64_t>> ropeLayers =
      cfg.getIntList({"no_rope_layers"});
  if (ropeLayers && !ropeLayers->empty() &&
      (int64_t)ropeLayers->size() != numLayers)
    cfg.fail("no_rope_layers", "expected " + std::to_string(numLayers) +
                                   " entries (num_hidden_layers), found " +
                                   std::to_string(ropeLayers->size()));
  auto usesRope = [&](int64_t i) {
    return ropeLayers && !ropeLayers->empty() ? (*ropeLayers)[i] != 0
                                              : (i + 1) % 4 != 0;
  };
  bool mixedShared = cfg.getBool({"use_mixed_mlp_moe"}).value_or(false);

  std::vector<std::string> indexerTypes;
  if (attention.indexTopK > 0)
    indexerTypes = readIndexerTypes(cfg, numLayers);

  for (int64_t i = 0; i < numLayers; ++i) {
    LayerSpec layer;
    layer.index = i;
    const std::string &type = pattern[i];
    layer.mixer = type == "linear_attention" ? linear : attention;
    if (!isKnownLayerType(type))
      layer.mixer.unseen.push_back("layer_types[" + std::to_string(i) + "] = \"" + printable(type, 80) + "\"");
    if (layer.mixer.indexTopK > 0) {
      const std::string &indexer = indexerTypes[i];
      layer.mixer.reusesIndexer = indexer == "shared";
      if (indexer != "full" && indexer != "shared")
        layer.mixer.unseen.push_back("indexer_types[" + std::to_string(i) + "] = \"" + printable(indexer, 80) + "\"");
    }
    if (type == "sliding_attention" && useSliding) {
      layer.mixer.window = "sliding";
      layer.mixer.windowSize = slidingWindow;
    } else if (chunk > 0 && (type == "chunked_attention" || usesRope(i))) {
      // Llama-4: chunked local attention with RoPE on three of every four
      // layers, global NoPE attention on the fourth.
      layer.mixer.window = "chunked";
      layer.mixer.windowSize = chunk;
    } else if (chunk > 0) {
      layer.mixer.rope.type = "none";
    }
    layer.ffn.activation = moeSpec.activation;
    if (moe[i]) {
      layer.ffn = moeSpec;
      layer.ffn.topK = topKs[i];
      layer.ffn.expertIntermediate = expertWidths[i];
      layer.ffn.numShared = sharedCounts[i];
      if (layer.ffn.topK < 1 || layer.ffn.topK > layer.ffn.numExperts)
        cfg.fail("num_experts_per_tok",
                 "expected 1.." + std::to_string(layer.ffn.numExperts) +
                     " experts per token, found " +
                     std::to_string(layer.ffn.topK));
      if (sharedWidth) {
        layer.ffn.sharedIntermediate = *sharedWidth;
        if (*sharedWidth > 0 && layer.ffn.numShared == 0)
          layer.ffn.numShared = 1;
      } else if (llama4) {
        layer.ffn.numShared = 1;
        layer.ffn.sharedIntermediate = expertWidths[i];
      } else if (mixedShared) {
        layer.ffn.sharedIntermediate = intermediate;
      } else {
        layer.ffn.sharedIntermediate = expertWidths[i];
      }
      if (layer.ffn.sharedIntermediate == 0)
        layer.ffn.numShared = 0;
    } else {
      layer.ffn.isMoe = false;
      layer.ffn.intermediate = denseWidth.value_or(intermediate);
    }
    // transformers' MiniMax (model_type minimax) always takes the normalised
    // input as the residual: MiniMax-M1's postnorm = true.
    layer.postNorm =
        cfg.getBool({"postnorm"}).value_or(spec.modelType == "minimax");
    bool linearLayer = type == "linear_attention";
    layer.attentionAlpha =
        linearLayer ? cfg.getDouble({"layernorm_linear_attention_alpha",
                                     "linear_attn_alpha_factor"}).value_or(1.0)
                    : cfg.getDouble({"layernorm_full_attention_alpha",
                                     "full_attn_alpha_factor"}).value_or(1.0);
    layer.attentionBeta =
        linearLayer ? cfg.getDouble({"layernorm_linear_attention_beta",
                                     "linear_attn_beta_factor"}).value_or(1.0)
                    : cfg.getDouble({"layernorm_full_attention_beta",
                                     "full_attn_beta_factor"}).value_or(1.0);
    layer.ffnAlpha =
        cfg.getDouble({"layernorm_mlp_alpha", "mlp_alpha_factor"}).value_or(1.0);
    layer.ffnBeta =
        cfg.getDouble({"layernorm_mlp_beta", "mlp_beta_factor"}).value_or(1.0);
    spec.layers.push_back(layer);
  }
  cfg.markRead({"layernorm_full_attention_alpha", "layernorm_full_attention_beta",
                "layernorm_linear_attention_alpha", "layernorm_linear_attention_beta",
                "layernorm_mlp_alpha", "layernorm_mlp_beta", "full_attn_alpha_factor",
                "full_attn_beta_factor", "linear_attn_alpha_factor",
                "linear_attn_beta_factor", "mlp_alpha_factor", "mlp_beta_factor",
                "mlp_bias", "use_bias", "dense_list"});
  spec.numMtpLayers =
      cfg.getInt({"num_nextn_predict_layers", "mtp_num_hidden_layers",
                  "num_mtp_modules"})
          .value_or(0);
  if (auto useMtp = cfg.getBool({"use_mtp"}); useMtp && !*useMtp)
    spec.numMtpLayers = 0;
  cfg.markRead({"mtp_transformer_layers", "mtp_use_dedicated_embeddings"});
}

/// Names the weight-layout family from recognised features (not model_type).
std::string recogniseFamily(const ModelSpec &spec, ConfigObject &cfg) {
  bool anyMla = false, anyGdn = false, anyKda = false, anyLightning = false;
  for (const LayerSpec &l : spec.layers) {
    anyMla |= l.mixer.kind == MixerKind::MLA;
    anyGdn |= l.mixer.kind == MixerKind::GatedDeltaNet;
    anyKda |= l.mixer.kind == MixerKind::KimiDelta;
    anyLightning |= l.mixer.kind == MixerKind::Lightning;
  }
  if (anyKda)
    return "kimi_linear";
  if (anyLightning)
    return "minimax_m1";
  if (anyGdn)
    return "qwen3_next";
  if (anyMla)
    return "deepseek_v3";
  const FfnSpec *moe = nullptr;
  for (const LayerSpec &l : spec.layers)
    if (l.ffn.isMoe && !moe)
      moe = &l.ffn;
  if (moe && moe->swigluLimit > 0)
    return "gpt_oss";
  if (cfg.has({"interleave_moe_layer_step", "attention_chunk_size"}))
    return "llama4";
  if (cfg.has({"use_mixed_mlp_moe"}))
    return "hunyuan";
  if (moe && moe->scoring == "sigmoid" && spec.layers.front().ffn.isMoe &&
      moe->numShared == 0)
    return "minimax_m2";
  if (moe && moe->scoring == "sigmoid")
    return "glm4_moe";
  if (moe && moe->numShared == 0 && !spec.layers.front().mixer.qkNorm &&
      !cfg.has({"head_dim"}))
    return "mixtral";
  return "qwen3_moe";
}

/// Records that \p feature was taken from the family, once per feature, with
/// the tensor of layer \p layer (or the key) that would confirm it.
void assume(ModelSpec &spec, const std::string &feature, int64_t layer, const std::string &tensor) {
  for (const Assumption &a : spec.assumptions)
    if (a.feature == feature)
      return;
  spec.assumptions.push_back(
      {feature, "family " + spec.family + ": its transformers classes always have it; config.json does not say",
       spec.weightPrefix + "layers." + std::to_string(layer) + "." + tensor});
}

/// Features a family always has although its config does not spell them;
/// each is recorded as an assumption with what would confirm it.
void applyFamilyFeatures(ModelSpec &spec) {
  for (LayerSpec &layer : spec.layers) {
    MixerSpec &m = layer.mixer;
    FfnSpec &f = layer.ffn;
    const int64_t i = layer.index;
    bool llama4 = spec.family == "llama4";
    if (llama4 && m.kind == MixerKind::Attention) {
      // Complex-number RoPE on adjacent pairs; a weightless L2 QK-norm on the
      // RoPE layers only; temperature tuning on the NoPE layers only.
      m.rope.interleaved = true;
      if (m.rope.type == "none")
        m.qkNorm = false;
      if (m.qkNorm)
        m.qkNormKind = "l2";
    }
    if (!llama4 || m.rope.type != "none")
      m.temperatureTuning = false;
    if (llama4 && f.isMoe) {
      // Top-1 of the logits; the sigmoid of its logit scales the input.
      f.scoring = "sigmoid";
      f.routing = "topk_score_input";
      f.fusedLayout = "concat_in_out";
    }
    if (spec.family == "gpt_oss" && f.isMoe) {
      f.routing = "topk_score"; // softmax over the top-k logits
      f.fusedLayout = "interleaved_in_out";
    }
    // Qwen3-VL-MoE stores fused experts [E, H, 2I] / [E, I, H]; transformers
    // transposes them on load (so PEFT sees [E, out, in]).
    if (spec.modelType.rfind("qwen3_vl", 0) == 0 && f.isMoe)
      f.fusedLayout = "concat_in_out_converted";
    // Mixtral's and MiniMax's routers renormalise the top-k weights always.
    if ((spec.family == "mixtral" || spec.family == "minimax_m1" ||
         spec.family == "minimax_m2") && f.isMoe)
      f.normTopK = true;
    if (spec.family == "gpt_oss" && m.kind == MixerKind::Attention) {
      m.sinks = true;
      m.outBias = true;
      layer.ffn.routerBias = layer.ffn.expertBias = layer.ffn.isMoe;
      assume(spec, "attention sinks", i, "self_attn.sinks");
      assume(spec, "o_proj bias", i, "self_attn.o_proj.bias");
      if (layer.ffn.isMoe) {
        assume(spec, "router bias", i, "mlp.router.bias");
        assume(spec, "expert biases", i, "mlp.experts.gate_up_proj_bias");
      }
    }
    if (spec.family == "qwen3_next" && m.kind == MixerKind::Attention) {
      if (!m.qkNorm)
        assume(spec, "QK norm", i, "self_attn.q_norm.weight");
      m.outputGate = true;
      m.qkNorm = true;
      assume(spec, "attention output gate (q_proj rows doubled)", i, "self_attn.q_proj.weight");
    }
    if (spec.family == "qwen3_next" && layer.ffn.isMoe && layer.ffn.numShared) {
      layer.ffn.sharedGate = true;
      assume(spec, "shared-expert gate", i, "mlp.shared_expert_gate.weight");
    }
    // Kimi-Linear's router (transformers' KimiLinearTopkRouter) always adds
    // e_score_correction_bias for selection; its shared experts are
    // num_shared_experts experts of moe_intermediate_size.
    if (spec.family == "kimi_linear" && layer.ffn.isMoe) {
      if (!layer.ffn.correctionBias)
        assume(spec, "router score-correction bias", i, "block_sparse_moe.gate.e_score_correction_bias");
      layer.ffn.correctionBias = true;
      if (layer.ffn.numShared > 0 && layer.ffn.sharedIntermediate == 0)
        layer.ffn.sharedIntermediate = layer.ffn.expertIntermediate;
    }
    if (spec.family != "gpt_oss")
      m.outBias = false;
  }
}

} // namespace

Result<ModelSpec> parseModelConfig(std::string_view text,
                                   const std::string &file,
                                   std::string_view hfQuantJson) {
  try {
    json root = parseJsonOrFail(text, file);
    if (!root.is_object())
      return InputError{file, "(top level)",
                        std::string("expected a JSON object, found ") +
                            root.type_name()};
    ModelSpec spec;
    spec.configFile = file;
    ConfigObject top(root, "", file);
    spec.modelType = top.getString({"model_type"}).value_or("");
    if (auto archs = top.getStringList({"architectures"}); archs && !archs->empty())
      spec.architecture = (*archs)[0];
    spec.dtype = top.getString({"torch_dtype", "dtype"}).value_or("bfloat16");

    // Multimodal releases nest the language model.
    std::optional<ConfigObject> nested = top.getObject("text_config");
    if (!nested)
      nested = top.getObject("llm_config");
    ConfigObject &text = nested ? *nested : top;
    if (nested) {
      spec.weightPrefix = "model.language_model.";
      text.readString({"torch_dtype", "dtype"}, spec.dtype);
      top.readBool({"tie_word_embeddings"}, spec.tieEmbeddings);
    }
    readDecoder(text, spec);
    if (nested)
      if (auto tie = top.getBool({"tie_word_embeddings"}))
        spec.tieEmbeddings = *tie && spec.tieEmbeddings;
    readQuantization(text, hfQuantJson, file, spec);
    if (nested)
      readQuantization(top, {}, file, spec);
    readEncoders(top, spec);
    // Qwen3-VL: interleaved M-RoPE; transformers' default sections when the
    // config names none (Qwen3-VL-30B-A3B's does not).
    if (spec.modelType.rfind("qwen3_vl", 0) == 0)
      for (LayerSpec &l : spec.layers)
        if (l.mixer.rope.type != "none") {
          if (l.mixer.rope.mropeSection.empty())
            l.mixer.rope.mropeSection = {24, 20, 20};
          l.mixer.rope.type = "mrope";
        }
    // DeepSeek sparse attention: GLM-MoE-DSA's indexer rotates adjacent
    // pairs, DeepSeek-V3.2's halves (transformers' classes fix it).
    if (spec.modelType == "glm_moe_dsa")
      for (LayerSpec &l : spec.layers)
        l.mixer.indexRopeInterleaved = true;
    if (std::any_of(spec.layers.begin(), spec.layers.end(),
                    [](const LayerSpec &l) { return l.mixer.indexTopK > 0; }))
      spec.notes.push_back(
          "DeepSeek sparse attention: LoRA trains through the attention over "
          "the indexer's top-k keys; the lightning indexer itself stays "
          "frozen (its selection is discrete and gets no gradient, as in "
          "transformers) and its KL training loss is not implemented");
    spec.family = recogniseFamily(spec, text);
    applyFamilyFeatures(spec);
    top.markRead({"mlp_depth", "use_unified_vision_chunk",
                  "use_interleaved_frame_timestamp", "num_media_embeds"});
    if (nested)
      text.collectUnknown(spec.unknownKeys);
    top.collectUnknown(spec.unknownKeys);
    if (spec.modelType.empty())
      spec.notes.push_back("config has no model_type; recognised by its keys "
                           "as the " + spec.family + " layout");
    if (std::optional<InputError> tooLarge = checkSizeLimits(spec))
      return *tooLarge;
    return spec;
  } catch (const ConfigError &e) {
    return e.error;
  } catch (const json::exception &e) {
    return InputError{file, "", std::string("unexpected JSON structure: ") +
                                    e.what()};
  }
}

Result<ModelSpec> readModelConfig(const std::string &path) {
  std::string text;
  if (std::string why = readWholeFile(path, text); !why.empty())
    return InputError{path, "", why};
  std::string dir = path.substr(0, path.find_last_of('/') + 1);
  std::string hfQuant, quantPath = dir + "hf_quant_config.json";
  if (struct stat st; ::stat(quantPath.c_str(), &st) == 0)
    if (std::string why = readWholeFile(quantPath, hfQuant); !why.empty())
      return InputError{quantPath, "", why};
  return parseModelConfig(text, path, hfQuant);
}

} // namespace adapt
