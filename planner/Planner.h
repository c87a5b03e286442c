//===- Planner.h - parallel layout, memory and step time of a run -*- C++ -*-===//
//
// `adapt plan`: for a model (its spec and counted parameters) and a cluster,
// enumerate the layouts adapt's runtime can run (TP x EP x PP x CP x DP, the
// runtime's checkLayout rules), estimate each rank's memory by category and
// the step time by part, and pick the fastest layout that fits. Estimates
// only: constants and their sources are in Hardware.cpp, and the estimates
// are checked against H200 measurements (tests/e2e/test_plan.py).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PLANNER_PLANNER_H
#define ADAPT_PLANNER_PLANNER_H

#include "parser/ModelSpec.h"
#include "passes/GapReport.h"
#include "planner/Hardware.h"

#include <cstdint>
#include <string>
#include <vector>

namespace adapt::plan {

/// Share of GPU memory a plan leaves free: the calibration bound on the
/// memory estimate (10 %, docs/plan.md), so a layout that fits on paper also
/// fits on the GPU.
constexpr double kMemoryHeadroom = 0.10;

/// What the user asks for.
struct PlanRequest {
  int64_t gpus = 1;
  int64_t gpusPerNode = 8;
  double gpuMemoryBytes = 0;   ///< 0: the hardware's.
  int64_t seqLen = 4096;
  int64_t globalBatch = 0;     ///< Sequences per step; 0: 2 per GPU.
  int64_t microBatch = 1;      ///< Sequences per micro-batch on each data rank.
  int64_t loraRank = 16;
  bool loraAttention = true;   ///< q/k/v/o (or the mixer's projections).
  bool loraExperts = true;     ///< Routed experts.
  bool loraMlp = false;        ///< Dense and shared MLPs.
  bool fp8Weights = false;     ///< Frozen weights stored in FP8.
};

/// One way to split the run over the GPUs: tp * ep * pp * cp * dp = gpus.
/// Ranks are ordered tp innermost, then cp, ep, dp, pp outermost.
struct Layout {
  int64_t tp = 1, ep = 1, pp = 1, cp = 1, dp = 1;
  bool recompute = false; ///< Per-layer activation recomputation.
  /// "TP2 EP8 PP1 CP1 DP4" (+ " recompute").
  std::string text() const;
};

/// Bytes on the busiest rank, by category.
struct MemoryEstimate {
  double weights = 0;      ///< Frozen non-expert weights.
  double experts = 0;      ///< Frozen routed-expert weights.
  double adapters = 0;     ///< LoRA weights and their gradients (fp32).
  double optimizer = 0;    ///< AdamW moments (fp32, ZeRO-1 over data ranks).
  double activations = 0;  ///< Saved for backward, all micro-batches in flight.
  double buffers = 0;      ///< Loss chunk, workspace, all-to-all buffers.
  double context = 0;      ///< CUDA context and NCCL outside the allocator.
  double total() const { return weights + experts + adapters + optimizer + activations + buffers + context; }
};

/// Seconds per optimizer step, by part (no overlap assumed).
struct TimeEstimate {
  double compute = 0;       ///< Decoder layers, LM head and loss.
  double expertAllToAll = 0;///< Dispatch and combine, forward and backward.
  double tensorParallel = 0;///< All-reduces of TP.
  double contextParallel = 0;///< CP: the key/value exchange, and the delta-rule layers' wait for the previous rank's state.
  double dataParallel = 0;  ///< Gradient reduction of the adapters.
  double bubble = 0;        ///< Pipeline fill and drain.
  double total() const { return compute + expertAllToAll + tensorParallel + contextParallel + dataParallel + bubble; }
};

/// A layout with its estimates.
struct Candidate {
  Layout layout;
  MemoryEstimate memory;
  TimeEstimate time;
  double tokensPerSecond = 0;
  bool fits = false;
  std::string verdict; ///< Why it lost, or "chosen".
};

/// The model's figures the estimates use (from the spec and the counts).
struct ModelFacts {
  std::string name;
  int64_t layers = 0, hidden = 0, vocab = 0;
  int64_t softmaxLayers = 0, sparseLayers = 0, deltaRuleLayers = 0, lightningLayers = 0;
  int64_t moeLayers = 0, experts = 0, topK = 0, expertWidth = 0;
  int64_t sharedWidth = 0; ///< Shared experts' total width per MoE layer.
  int64_t denseWidth = 0;  ///< Dense MLP width of the non-MoE layers.
  int64_t heads = 0, kvHeads = 0;
  int64_t queryWidth = 0, keyValueWidth = 0; ///< heads*headDim, kvHeads*headDim (per layer, largest).
  int64_t deltaValueWidth = 0;               ///< Linear attention value heads * dim.
  int64_t lightningWidth = 0, lightningHeadDim = 0; ///< Lightning heads*headDim and headDim (largest).
  /// Runs of consecutive delta-rule layers (Gated DeltaNet, KDA) between
  /// the layers that synchronise the CP ranks (softmax and sparse attention
  /// gather the earlier keys, lightning its parts' states): under CP each
  /// run waits for the previous rank's state, layer by layer.
  int64_t deltaRuleRuns = 0;
  bool perChannelDecay = false; ///< Some delta-rule layer is Kimi's (a decay per key channel).
  int64_t indexTopK = 0;
  int64_t indexWidth = 0; ///< DSA indexer heads * head dim.
  double totalParameters = 0, expertParameters = 0, activeParameters = 0;
  double embeddingParameters = 0, lmHeadParameters = 0;
  double attentionAdapter = 0, expertAdapter = 0, mlpAdapter = 0; ///< LoRA params per rank 1, whole model.
  bool tensorSplittable = true;  ///< Every mixer is softmax attention (the runtime's TP rule).
  std::vector<int64_t> expertCounts; ///< Experts of each MoE layer (EP must divide each).
};

/// The figures of \p spec with its counted \p parameters, for LoRA rank
/// \p request.loraRank on the requested targets.
ModelFacts modelFacts(const ModelSpec &spec, const ParameterCounts &parameters, const PlanRequest &request);

/// The result: candidates best first; chosen = 0 when the first fits.
struct Plan {
  ModelFacts facts;
  PlanRequest request;
  const Hardware *hardware = nullptr;
  std::vector<Candidate> candidates;
  int chosen = -1;                     ///< Index into candidates, -1: none fits.
  std::string refusal;                 ///< When none fits: what is too big.
  std::vector<std::string> suggestions;///< When none fits: what would.
  int64_t layoutsConsidered = 0;
  std::vector<std::string> rules;      ///< The enumeration rules applied.
};

/// Enumerates, estimates and ranks the layouts.
Plan makePlan(const ModelFacts &facts, const PlanRequest &request, const Hardware &hardware);

/// The estimates of one layout (exposed for tests and calibration).
Candidate estimate(const ModelFacts &facts, const PlanRequest &request, const Hardware &hardware,
                   const Layout &layout);

} // namespace adapt::plan

#endif // ADAPT_PLANNER_PLANNER_H
