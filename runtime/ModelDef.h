//===- ModelDef.h - what a generated trainer tells the runtime --*- C++ -*-===//
//
// The contract between code generation and the runtime. A generated training
// program fills one ModelDef (plain data: numbers, flags and the checkpoint's
// own tensor names) and hands it to the runtime, which assembles the model
// from its operator library. No LibTorch here, so the code generator and its
// tests can include it cheaply.
//
// Tensor names are the checkpoint's. Per-expert tensors carry "{e}" for the
// expert number; the loader stacks them into one grouped tensor [E, out, in].
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_MODELDEF_H
#define ADAPT_RUNTIME_MODELDEF_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace adapt::rt {

/// Rotary position embedding of one attention layer.
struct RopeDef {
  bool enabled = true;        ///< false: NoPE layer (Llama-4's global layers).
  int64_t rotaryDim = 0;      ///< Leading head dims that rotate (partial RoPE).
  double theta = 10000.0;
  bool interleaved = false;   ///< Pairs (2i, 2i+1) rotate; else halves (rotate_half).
  std::string scaling;        ///< ""|"yarn"|"llama3"
  double factor = 1.0;
  int64_t originalMaxPositions = 0;
  double betaFast = 32.0, betaSlow = 1.0;          ///< YaRN.
  double mscale = 1.0, mscaleAllDim = 0.0;         ///< YaRN (DeepSeek form).
  bool truncate = true;                            ///< YaRN: round the ramp bounds.
  double lowFreqFactor = 1.0, highFreqFactor = 4.0; ///< llama3.
  /// Interleaved M-RoPE (Qwen3-VL): frequencies per position axis (t, h, w),
  /// summing to rotaryDim/2. Frequency i rotates by the h position when
  /// i % 3 == 1 and i < 3*section[1], by w when i % 3 == 2 and i < 3*section[2],
  /// else by t. Empty: one position axis (plain RoPE). Text-only batches give
  /// all three axes the same position, which is plain RoPE.
  std::vector<int64_t> mropeSection;
};

/// Which token mixer a layer uses.
enum class AttentionKind {
  Gqa,           ///< Softmax attention, GQA/MHA (optionally output-gated: Qwen3-Next).
  Mla,           ///< DeepSeek's multi-head latent attention.
  GatedDeltaNet, ///< Qwen3-Next's gated delta rule (AttentionDef::linear).
  KimiDelta,     ///< Kimi-Linear's delta attention, per-channel decay (AttentionDef::linear).
  Lightning,     ///< MiniMax-M1's decayed linear attention in blocks (AttentionDef::linear).
  SparseMla,     ///< DeepSeek sparse attention: indexer + top-k + MLA (AttentionDef::indexer).
};

/// Linear attention of one layer: a per-head recurrent state instead of a
/// KV cache, trained in chunks. Shared by GatedDeltaNet, KimiDelta and
/// Lightning; each kind documents the fields it reads.
struct LinearAttentionDef {
  int64_t keyHeads = 0, valueHeads = 0;
  int64_t keyHeadDim = 0, valueHeadDim = 0;
  int64_t convKernel = 0;  ///< Short causal depthwise convolution width (0: none).
  int64_t chunkSize = 64;  ///< Chunk length of the chunked training form.
  /// Delta rule (GatedDeltaNet, KimiDelta): sequences longer than this are
  /// run in segments recomputed in the backward pass, keeping only the state
  /// at segment boundaries (LinearAttention.h gatedDeltaRuleSegmented); the
  /// values are identical. 0: never.
  int64_t segmentTokens = 16384;
  // -- linear attention kind-specific fields below (one block per kind) --
  // Lightning (MiniMax): chunkSize is the config's block_size (the blocked
  // form's block; the result does not depend on it). The decay slopes follow
  // from keyHeads, LayerDef::index and decayLayers; q, k, v are SiLU(qkv_proj).
  int64_t decayLayers = 0;    ///< Lightning: num_hidden_layers in the slope's layer factor.
  double outputNormEps = 1e-6; ///< Lightning: eps of the output RMSNorm (transformers' default, not rms_norm_eps).
};

/// DeepSeek sparse attention's lightning indexer: which keys each query sees.
struct SparseIndexerDef {
  int64_t heads = 0, headDim = 0;
  int64_t topK = 0;        ///< Keys kept per query.
  // -- indexer-specific fields below --
  /// The indexer's own RoPE layout on the first qkRopeDim dims of its heads:
  /// adjacent pairs (GLM-5) or halves (DeepSeek-V3.2). The MLA part keeps
  /// AttentionDef::rope.interleaved.
  bool ropeInterleaved = false;
  double keyNormEps = 1e-6;   ///< indexer.k_norm is a LayerNorm (weight and bias).
  /// Epsilon of the SparseMla layer's q_a_layernorm and kv_a_layernorm:
  /// transformers' DSA classes build them with the default 1e-6, not
  /// rms_norm_eps (GLM-5: 1e-5).
  double latentNormEps = 1e-6;
  int64_t queryBlock = 64;    ///< Queries scored and attended per block.
  /// Role -> checkpoint name (in AttentionDef::weights): indexer.wq_b,
  /// indexer.wk, indexer.k_norm, indexer.k_norm.bias, indexer.weights_proj.
};

/// Settings: the fields of a layer that take a config value as it is (a
/// flag, a number). The parser fills these very structs (parser/ModelSpec.h's
/// MixerSpec and FfnSpec derive from them), the importer copies each onto its
/// op as the attribute visitSettings names, and codegen prints each from that
/// attribute (codegen/EmitLayer.cpp). So a new setting is a field here, its
/// line in visitSettings, its attribute in ir/AdaptOps.td, the config key the
/// parser reads, and the op that uses it: neither the importer nor codegen
/// changes. tests/unit/SettingsTest.cpp checks the names against the ODS.
struct AttentionSettings {
  bool qkvBias = false;
  /// Sigmoid output gate: Qwen3-Next's q_proj also yields a per-head gate,
  /// out *= sigmoid(gate); MiniMax-M1's lightning attention has its own.
  bool outputGate = false;
  bool sinks = false;         ///< Learned per-head sink logits (gpt-oss).
  double softmaxScale = 0.0;  ///< 0: 1/sqrt(headDim).
  /// Llama-4 NoPE layers: q scaled by log1p(floor((pos+1)/floorScale))*attnScale+1.
  bool temperatureTuning = false;
  double floorScale = 8192.0, attnScale = 0.1;
};

/// Each setting of \p s as (its adapt.attention attribute, its field's name,
/// its value), in the order codegen prints them.
template <typename Visitor> void visitSettings(const AttentionSettings &s, Visitor &&visit) {
  visit("qkv_bias", "qkvBias", s.qkvBias);
  visit("output_gate", "outputGate", s.outputGate);
  visit("sinks", "sinks", s.sinks);
  visit("softmax_scale", "softmaxScale", s.softmaxScale);
  visit("temperature_tuning", "temperatureTuning", s.temperatureTuning);
  visit("floor_scale", "floorScale", s.floorScale);
  visit("attn_scale", "attnScale", s.attnScale);
}

/// One attention layer: GQA/MHA (with QK-norm, biases, sinks, windows) or
/// DeepSeek's multi-head latent attention.
struct AttentionDef : AttentionSettings {
  AttentionKind kind = AttentionKind::Gqa;
  int64_t heads = 0, kvHeads = 0;
  int64_t headDim = 0;        ///< q/k head dim (MLA: nope + rope).
  int64_t vHeadDim = 0;       ///< v head dim.
  /// "" none, "head": RMSNorm over each head (Qwen3, GLM), "full": RMSNorm
  /// over all heads' width before the split (MiniMax-M2), "l2": weightless L2
  /// norm after RoPE (Llama-4).
  std::string qkNorm;
  bool outBias = false;
  int64_t slidingWindow = 0;  ///< >0: attend to the last N positions only.
  int64_t chunkSize = 0;      ///< >0: attend within fixed chunks (Llama-4).
  /// An approved generated attention core (task attention_core: softmax over
  /// causal, windowed keys with optional sinks; runtime/GeneratedOps.h);
  /// "" = the library's attention().
  std::string generatedCore;
  /// An approved generated rotary embedding (task rope); "" = applyRope().
  std::string generatedRope;
  // MLA.
  int64_t qLoraRank = 0, kvLoraRank = 0, qkNopeDim = 0, qkRopeDim = 0;
  RopeDef rope;
  LinearAttentionDef linear;  ///< GatedDeltaNet, KimiDelta, Lightning.
  SparseIndexerDef indexer;   ///< SparseMla.
  /// Role -> checkpoint name: q_proj, k_proj, v_proj, o_proj (+ ".bias"),
  /// q_norm, k_norm, sinks; MLA: q_a_proj, q_a_layernorm, q_b_proj,
  /// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj.
  std::map<std::string, std::string> weights;
};

/// How a MoE layer picks experts and weighs their outputs.
enum class RouterKind {
  SoftmaxTopK,   ///< softmax over all, top-k, optional renormalise (Qwen, Mixtral).
  SigmoidTopK,   ///< sigmoid, (+bias) group-limited top-k, renormalise, scale (DeepSeek, MiniMax-M2).
  TopKSoftmax,   ///< top-k of logits, softmax over the k (gpt-oss).
  TopKSigmoidInput, ///< top-k of logits, sigmoid scales the expert input (Llama-4).
};

/// Expert activation.
enum class ExpertAct { SwiGLU, ClampedSwiGLU };

/// The settings of an FFN (see AttentionSettings).
struct FfnSettings {
  bool normTopK = false;
  double routedScaling = 1.0;
  bool correctionBias = false;    ///< e_score_correction_bias used for selection.
  int64_t groups = 1, topKGroups = 1; ///< Group-limited top-k: expert groups, groups kept.
  bool routerBias = false;
  bool expertBias = false;
};

/// Each setting of \p s as (its adapt.moe attribute, its field's name, its value).
template <typename Visitor> void visitSettings(const FfnSettings &s, Visitor &&visit) {
  visit("norm_topk", "normTopK", s.normTopK);
  visit("routed_scaling", "routedScaling", s.routedScaling);
  visit("bias_correction", "correctionBias", s.correctionBias);
  visit("num_groups", "groups", s.groups);
  visit("topk_groups", "topKGroups", s.topKGroups);
  visit("router_bias", "routerBias", s.routerBias);
  visit("expert_bias", "expertBias", s.expertBias);
}

/// Mixture of experts, or (experts == 0) a dense gated MLP.
struct FfnDef : FfnSettings {
  int64_t experts = 0, topK = 0;
  int64_t intermediate = 0;       ///< Per-expert width, or the dense MLP's.
  RouterKind router = RouterKind::SoftmaxTopK;
  ExpertAct act = ExpertAct::SwiGLU;
  double swigluAlpha = 1.702, swigluLimit = 7.0; ///< ClampedSwiGLU.
  /// Checkpoint stores fused gate_up: "" per-expert split tensors,
  /// "concat_out_in" [E, 2I, H] gate then up, "interleaved_in_out" [E, H, 2I]
  /// gate/up alternating (gpt-oss), "concat_in_out" [E, H, 2I] (Llama-4),
  /// "concat_in_out_converted" [E, H, 2I] on disk that transformers (and so
  /// PEFT) holds as [E, 2I, H] (Qwen3-VL-MoE).
  std::string fusedLayout;
  /// An approved generated router (runtime/GeneratedOps.h) named by its
  /// gaps.json component; "" = the library's router for `router`.
  std::string generatedRouter;
  /// An approved generated gated activation for the routed experts (task
  /// glu_activation); "" = the library's for `act`.
  std::string generatedActivation;
  int64_t sharedIntermediate = 0; ///< Shared expert width (all shared fused).
  bool sharedGate = false;        ///< Sigmoid gate on the shared expert.
  /// Role -> checkpoint name. Dense: gate_proj, up_proj, down_proj.
  /// MoE: router (+ .bias), correction_bias, gate_proj/up_proj/down_proj with
  /// "{e}" or gate_up_proj/down_proj fused (+ _bias), shared.gate_proj,
  /// shared.up_proj, shared.down_proj, shared_gate.
  std::map<std::string, std::string> weights;
};

/// One decoder layer: pre-norm attention and pre-norm FFN, residuals.
struct LayerDef {
  int64_t index = 0;
  AttentionDef attention;
  FfnDef ffn;
  std::string inputNorm, postAttentionNorm; ///< RMSNorm weight names.
  /// Module path of this layer in the Hugging Face model, for PEFT keys:
  /// "model.layers.3." The FFN's module is "mlp." there in every family.
  std::string hfPrefix;
  std::string hfAttention = "self_attn.", hfFfn = "mlp.";
  /// Residual scaling (MiniMax): h' = alpha * r + beta * f(norm(h)), where the
  /// residual r is h, or norm(h) when normedResidual; 1, 1 otherwise.
  double attentionResidualAlpha = 1.0, attentionResidualBeta = 1.0;
  double ffnResidualAlpha = 1.0, ffnResidualBeta = 1.0;
  /// MiniMax-M1 postnorm (always so in transformers' MiniMaxDecoderLayer): the
  /// residual of both sublayers is the normalised input, not the input.
  bool normedResidual = false;
};

/// The LoRA adapters: settings, and the modules that get them.
struct LoraDef {
  int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  bool rslora = false;
  /// The user's target patterns ("q_proj", "experts", "all-linear"): a
  /// record only; adapt-inject-lora resolved them into `modules`.
  std::vector<std::string> targets;
  /// Exactly the modules that get adapters, as paths inside a layer of the
  /// Hugging Face model ("self_attn.q_proj", "mlp.experts.gate_up_proj",
  /// "mlp.gate" for a router adapted with --lora-router).
  std::vector<std::string> modules;
  bool router = false;   ///< Record: --lora-router was given.
};

/// The Qwen3-VL vision tower: patch embedding, learned position embeddings
/// bilinearly resampled to each image's grid, 2-D rotary ViT blocks with
/// attention inside each image, a 2x2 patch merger into the text width and
/// deepstack mergers whose features are added to the first text layers'
/// outputs. depth == 0: no tower (text-only model).
struct VisionDef {
  int64_t depth = 0, hidden = 0, heads = 0, intermediate = 0;
  int64_t patchSize = 16, temporalPatch = 2, inChannels = 3, spatialMerge = 2;
  int64_t numPositions = 0;     ///< Learned position embeddings (a square grid).
  int64_t outHidden = 0;        ///< Merger output width (the text hidden size).
  std::vector<int64_t> deepstackLayers; ///< Blocks whose output feeds a deepstack merger.
  std::string act = "gelu_pytorch_tanh"; ///< Block MLP activation (mergers use exact GELU).
  double ropeTheta = 10000.0;   ///< 2-D (axial) rotary base.
  double normEps = 1e-6;        ///< LayerNorm epsilon.
  int64_t imageTokenId = -1;    ///< Placeholder token the merged features replace.
  /// Checkpoint prefix of the tower's tensors; also its module path in the
  /// Hugging Face model ("model.visual.").
  std::string prefix = "model.visual.";
  bool enabled() const { return depth > 0; }
};

/// The whole decoder-only model.
/// The parallel layout `adapt plan` chose for this model (`adapt build
/// --plan`): the trainer's layout when no layout flag is given.
struct PlannedLayout {
  bool present = false;
  int64_t tp = 1, ep = 1, pp = 1, cp = 1, dp = 1;
  bool recompute = false;
  int64_t processes() const { return tp * ep * pp * cp * dp; }
};

struct ModelDef {
  std::string family;       ///< adapt's family id, e.g. "qwen3_moe".
  std::string modelType;    ///< config.json's model_type, for the adapter config.
  std::string architecture; ///< architectures[0].
  int64_t vocab = 0, hidden = 0;
  double normEps = 1e-6;
  bool tieEmbeddings = false;
  std::string embedding, finalNorm, lmHead; ///< Weight names.
  /// Zero-centred RMSNorm weights (Qwen3-Next): the scale is 1 + weight.
  bool normWeightOffset = false;
  std::vector<LayerDef> layers;
  LoraDef lora;
  VisionDef vision;         ///< Image encoder (Qwen3-VL); depth 0: none.
  PlannedLayout plannedLayout;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_MODELDEF_H
