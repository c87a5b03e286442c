//===- GapReport.h - what the gap analysis found, as plain data -*- C++ -*-===//
//
// The passes fill this; report/ writers turn it into gaps.json (schema in
// docs/gaps-schema.md, stable: LLM agents read it), gaps.md and gaps.html.
// Plain data with no MLIR in it.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PASSES_GAPREPORT_H
#define ADAPT_PASSES_GAPREPORT_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace adapt {

/// Support status of one component, worst first. Excluded: the training
/// forward deliberately does not run the component (as the reference
/// implementation does not) and keeps its weights unchanged, e.g. the
/// multi-token-prediction heads; not a gap, but shown as such.
enum class GapStatus { Missing, Partial, Supported, Excluded };

/// "missing", "partial", "supported" or "excluded".
const char *gapStatusName(GapStatus status);

/// What a gap stops a user from doing with the component.
struct BlockedCapabilities {
  bool forward = false;  ///< No forward pass: the model cannot run at all.
  bool backward = false; ///< No backward: nothing upstream can train.
  bool lora = false;     ///< No LoRA adapters on this component.
  std::vector<std::string> parallelLayouts; ///< Layouts not available (tp, ep, ...).
};

/// One model component (all layers that share an op variant) and its status.
struct ComponentGap {
  std::string id;      ///< Stable id, e.g. "moe.sigmoid.grouped.bias".
  std::string op;      ///< IR op name, e.g. "adapt.moe".
  std::string variant; ///< Human summary of the variant.
  std::map<std::string, std::string> features; ///< Variant features.
  GapStatus status = GapStatus::Missing;
  std::vector<std::string> reasons;   ///< Why not supported (one per cause).
  std::vector<int64_t> layers;        ///< Decoder layers using it (-1: none).
  int64_t parameters = 0;             ///< Over all its layers.
  int64_t activeParameters = 0;       ///< Used per token.
  BlockedCapabilities blocks;
  std::string registryEntry;          ///< Matched registry entry, "" if none.
  /// What closes the gap ("" when supported): which command, flag or
  /// runtime change.
  std::string nextStep;
};

/// One disagreement between the config's implied tensors and the files.
struct ManifestIssue {
  std::string kind;     ///< missing|extra|shape|dtype|shard|size
  std::string tensor;   ///< Tensor name (or pattern, for whole groups).
  std::string expected;
  std::string found;
};

/// What the manifest check saw.
struct ManifestCheck {
  bool checked = false;       ///< False when the folder has no index.
  std::string file;
  int64_t tensors = 0;        ///< Tensors in the manifest.
  int64_t expectedTensors = 0;///< Tensors the config implies.
  int64_t shards = 0;
  int64_t headersRead = 0;    ///< Shard headers compared tensor by tensor.
  std::vector<ManifestIssue> issues;
};

/// Parameter accounting; every figure in parameters, not bytes.
struct ParameterCounts {
  int64_t total = 0;          ///< Everything: decoder + MTP + encoders.
  int64_t active = 0;         ///< Per token through decoder (+ encoders' none).
  int64_t decoder = 0;        ///< Embedding + layers + final norm + LM head.
  int64_t embedding = 0;
  int64_t lmHead = 0;         ///< 0 when tied.
  int64_t mtp = 0;            ///< Multi-token-prediction layers.
  int64_t encoders = 0;       ///< Vision/audio towers and projectors.
  int64_t activeWithMtp = 0;
  /// Active minus the embedding lookup (a gather, not a matmul): how OpenAI
  /// and MiniMax count active parameters.
  int64_t activeWithoutEmbedding = 0;
  /// Active minus embedding and LM head: how Qwen counts activated ones.
  int64_t activeNonEmbedding = 0;
  /// Decoder total minus embedding and LM head.
  int64_t decoderNonEmbedding = 0;
  std::map<std::string, int64_t> byComponent; ///< Component kind -> total.
};

/// Why an unknown config key \p path may change the model's structure (its
/// name reads like a size, a count, a layer list, a kind or a sharing/feature
/// switch), or "" when it reads like bookkeeping. A heuristic on the name
/// only: the report flags the key for a human, it never decides a status.
std::string structuralHint(const std::string &path);

/// A feature taken from the recognised family, not read from the config.
struct ReportedAssumption {
  std::string feature;   ///< "shared-expert gate".
  std::string basis;     ///< Why it was assumed.
  std::string confirmBy; ///< The tensor name or config key that would confirm it.
  /// "confirmed" (the manifest lists the tensor), "contradicted" (it does
  /// not: the manifest check reports it missing too) or "unconfirmed" (no
  /// weight index to look in, or a key).
  std::string status;
};

/// The whole report.
struct GapReport {
  std::string schemaVersion = "1";
  std::string source;       ///< Path given on the command line.
  std::string modelType;
  std::string architecture;
  std::string family;
  std::string summary;      ///< One line: "N components: a supported, ..."
  ParameterCounts parameters;
  std::vector<ComponentGap> components;
  std::vector<std::pair<std::string, std::string>> unknownConfigKeys;
  ManifestCheck manifest;
  std::vector<std::string> notes;
  std::vector<ReportedAssumption> assumptions;

  /// True when some component is partial or missing, or the manifest
  /// disagrees with the config: `adapt gaps` then exits 3.
  bool hasGaps() const;
};

} // namespace adapt

#endif // ADAPT_PASSES_GAPREPORT_H
