//===- ModelSpec.h - a model's architecture, normalised ---------*- C++ -*-===//
//
// The config reader turns any `config.json` (whatever its family spells a key)
// into this one normalised description; the IR importer turns it into the
// `adapt` dialect. Plain data with no MLIR in it, so parsers and their fuzz
// targets build fast. The settings structs are the runtime's
// (runtime/ModelDef.h, plain data too): one description of those values
// from the config to the generated trainer.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_MODELSPEC_H
#define ADAPT_PARSER_MODELSPEC_H

#include "runtime/ModelDef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace adapt {

/// The token mixer of one decoder layer.
enum class MixerKind {
  Attention,       ///< Softmax attention, MHA/GQA/MQA.
  MLA,             ///< Multi-head latent attention (DeepSeek, Kimi).
  GatedDeltaNet,   ///< Gated delta rule linear attention (Qwen3-Next, Qwen3.5).
  KimiDelta,       ///< Kimi Delta Attention: per-channel gated delta rule.
  Lightning,       ///< MiniMax lightning attention (decayed linear attention).
};

/// Rotary position embedding as the config describes it.
struct RopeSpec {
  std::string type = "default"; ///< default|yarn|llama3|dynamic|ntk_alpha|mrope|none|...
  double theta = 10000.0;
  double factor = 1.0;
  double partialFactor = 1.0;   ///< Fraction of head_dim that is rotated.
  int64_t originalMaxPositions = 0;
  bool interleaved = false;     ///< Pairs (2i, 2i+1) rotate (GPT-J style).
  // YaRN (rope_scaling keys; defaults are transformers').
  double betaFast = 32.0, betaSlow = 1.0;
  double mscale = 1.0, mscaleAllDim = 0.0;
  bool truncate = true;         ///< Round the correction range (gpt-oss: false).
  // llama3.
  double lowFreqFactor = 1.0, highFreqFactor = 4.0;
  /// M-RoPE (Qwen-VL): frequencies per position axis (t, h, w); empty: none.
  std::vector<int64_t> mropeSection;
};

/// Everything needed to know the shape and semantics of one token mixer.
/// Its settings (qkvBias, outputGate, sinks, softmaxScale, temperature
/// tuning) are the runtime's own struct, filled here and copied through the
/// IR unchanged (runtime/ModelDef.h, AttentionSettings).
struct MixerSpec : rt::AttentionSettings {
  MixerKind kind = MixerKind::Attention;
  /// Enumerated config values adapt has never seen that decide this
  /// component (`layer_types[3] = "mamba2"`): the gap report calls it
  /// missing, naming them; the rest is read as the nearest known case so
  /// that parameters are still counted.
  std::vector<std::string> unseen;
  /// GLM-5's "shared" indexer layers (indexer_types, index_topk_pattern,
  /// index_topk_freq): the layer reuses the top-k of the previous layer that
  /// ran its own indexer, and has no indexer weights of its own.
  bool reusesIndexer = false;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;        ///< q/k head dim (MLA: nope + rope).
  int64_t vHeadDim = 0;       ///< v head dim.
  // MLA.
  int64_t qLoraRank = 0;      ///< 0: q is a plain projection.
  int64_t kvLoraRank = 0;
  int64_t qkNopeDim = 0;
  int64_t qkRopeDim = 0;
  // Windowing: "none", "sliding" or "chunked".
  std::string window = "none";
  int64_t windowSize = 0;
  bool qkNorm = false;        ///< RMSNorm on q and k.
  /// "head": RMSNorm per head (Qwen3, GLM, Hunyuan), "full": over all heads'
  /// width (MiniMax-M2), "l2": weightless L2 norm (Llama-4).
  std::string qkNormKind = "head";
  bool outBias = false;
  // Linear attention.
  int64_t linearKeyHeads = 0;
  int64_t linearValueHeads = 0;
  int64_t linearKeyDim = 0;
  int64_t linearValueDim = 0;
  int64_t convKernel = 0;     ///< Short causal conv width; 0 when none.
  int64_t blockSize = 0;      ///< Lightning: block_size of the blocked form (256 default).
  // DeepSeek sparse attention (lightning indexer + top-k).
  int64_t indexHeads = 0;
  int64_t indexHeadDim = 0;
  int64_t indexTopK = 0;      ///< 0: dense attention.
  /// The indexer's RoPE rotates adjacent pairs (GLM-5) rather than halves
  /// (DeepSeek-V3.2); transformers fixes it per model class.
  bool indexRopeInterleaved = false;
  RopeSpec rope;
};

/// Feed-forward part of a layer: dense MLP or mixture of experts. Its
/// settings (normTopK, routedScaling, correctionBias, groups, topKGroups,
/// routerBias, expertBias) are the runtime's FfnSettings.
struct FfnSpec : rt::FfnSettings {
  bool isMoe = false;
  std::vector<std::string> unseen; ///< As MixerSpec::unseen.
  int64_t intermediate = 0;        ///< Dense MLP width.
  int64_t numExperts = 0;          ///< Routed experts.
  int64_t topK = 0;
  int64_t expertIntermediate = 0;
  int64_t numShared = 0;           ///< Shared experts (fused into one MLP).
  int64_t sharedIntermediate = 0;  ///< Width of each shared expert.
  bool sharedGate = false;         ///< Sigmoid gate on the shared expert (Qwen).
  std::string scoring = "softmax"; ///< softmax|sigmoid
  /// "score_topk": score every expert, then top-k (Qwen, Mixtral, DeepSeek);
  /// "topk_score": top-k of the logits, then score the k (gpt-oss);
  /// "topk_score_input": like topk_score, the score scales the expert's
  /// input instead of its output (Llama-4).
  std::string routing = "score_topk";
  double swigluLimit = 0.0;        ///< gpt-oss clamped SwiGLU; 0 when plain.
  double swigluAlpha = 1.702;      ///< Clamped SwiGLU's sigmoid slope.
  /// How a fused gate_up tensor is stored: "" per-expert split tensors,
  /// "interleaved_in_out" [E, H, 2I] gate/up alternating (gpt-oss),
  /// "concat_in_out" [E, H, 2I] gate then up (Llama-4),
  /// "concat_in_out_converted" the same on disk, [E, 2I, H] in transformers
  /// after its load-time transpose (Qwen3-VL-MoE).
  std::string fusedLayout;
  std::string activation = "silu";
};

/// One decoder layer.
struct LayerSpec {
  int64_t index = 0;
  MixerSpec mixer;
  FfnSpec ffn;
  /// MiniMax-M1 postnorm (and transformers' MiniMax always): the residual of
  /// both sublayers is the normalised input, not the input.
  bool postNorm = false;
  /// MiniMax's residual scaling: h' = alpha * residual + beta * sublayer
  /// (layernorm_*_alpha/beta, transformers' *_alpha/beta_factor); 1 otherwise.
  double attentionAlpha = 1.0, attentionBeta = 1.0;
  double ffnAlpha = 1.0, ffnBeta = 1.0;
};

/// An encoder for another modality (coarse: enough to count and match it).
struct EncoderSpec {
  std::string modality;   ///< "vision" or "audio".
  std::string type;       ///< The encoder config's model_type or a description.
  int64_t depth = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t numHeads = 0;
  int64_t patchSize = 0;
  int64_t temporalPatch = 1;
  int64_t inChannels = 3;
  int64_t spatialMerge = 1;
  int64_t numPositions = 0;  ///< Learned position embeddings.
  int64_t outHidden = 0;     ///< Width after the merger/projector.
  std::vector<int64_t> deepstackLayers;
  std::string activation;    ///< hidden_act of the blocks' MLP ("" when unset).
  int64_t imageTokenId = -1; ///< Placeholder token of an image (top-level image_token_id).
  double ropeTheta = 10000.0; ///< Vision rotary base (rope_parameters.rope_theta).
};

/// Weight quantization as the checkpoint stores it.
struct QuantSpec {
  std::string method;       ///< ""|fp8|mxfp4|nvfp4|compressed-tensors|...
  std::string format;       ///< e.g. e4m3, pack-quantized.
  int64_t blockRows = 0;    ///< Block size for block-scaled formats.
  int64_t blockCols = 0;
  int64_t groupSize = 0;
  int64_t bits = 0;
  std::vector<std::string> excluded; ///< modules_to_not_convert / ignore.
};

/// A config key that nothing in adapt understands: reported, never ignored.
struct UnknownKey {
  std::string path;  ///< Dotted JSON path, e.g. "text_config.foo".
  std::string value; ///< The value, abbreviated.
};

/// A feature the reader took from the recognised family rather than from the
/// config: what would confirm it is a tensor name (checked against the
/// manifest when there is one) or a config key.
struct Assumption {
  std::string feature; ///< "attention sinks", "shared-expert gate", ...
  std::string basis;   ///< Why it is assumed.
  /// The tensor (first layer it applies to) that would confirm it, under the
  /// decoder prefix: refineWithManifest names it in full and checks it.
  std::string confirmBy;
  /// "confirmed" (the manifest lists the tensor), "contradicted" (it does
  /// not) or "unconfirmed" (no weight index to look in).
  std::string status = "unconfirmed";
};

/// The normalised model.
struct ModelSpec {
  std::string configFile;   ///< Where the config came from.
  std::string modelType;    ///< config's model_type (may be unseen).
  std::string architecture; ///< architectures[0], informational.
  std::string family;       ///< Weight-layout family recognised by features.
  std::vector<std::string> features; ///< Recognised features, for `inspect`.
  int64_t hidden = 0;
  int64_t vocab = 0;
  int64_t maxPositions = 0;
  bool tieEmbeddings = false;
  double normEps = 1e-6;
  std::string dtype = "bfloat16";
  std::string weightPrefix = "model."; ///< Prefix of decoder tensor names.
  std::vector<LayerSpec> layers;
  int64_t numMtpLayers = 0; ///< Multi-token-prediction layers after the stack.
  std::vector<EncoderSpec> encoders;
  QuantSpec quant;
  std::vector<UnknownKey> unknownKeys;
  std::vector<std::string> notes; ///< Remarks for the report.
  std::vector<Assumption> assumptions; ///< Features inferred, not read; one per feature.
};

} // namespace adapt

#endif // ADAPT_PARSER_MODELSPEC_H
