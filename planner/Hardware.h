//===- Hardware.h - GPU and fabric constants the planner uses ---*- C++ -*-===//
//
// Every constant here has a source: measured on this project's H200
// (docs/performance.md, bench/h200_speed.sh) or a cited public figure.
// Hardware.cpp holds the values; this header only their meaning.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PLANNER_HARDWARE_H
#define ADAPT_PLANNER_HARDWARE_H

#include <string>

namespace adapt::plan {

/// One GPU kind, the fabric between GPUs, and how efficiently adapt's
/// runtime uses them (measured).
struct Hardware {
  std::string name;
  double memoryBytes = 0;       ///< GPU memory per rank (default; --gpu-memory overrides).
  double bf16Flops = 0;         ///< Dense bf16 matmul rate reached by cuBLAS, FLOP/s.
  double fp8Flops = 0;          ///< Dense FP8 rate, FLOP/s.
  double intraNodeBytesPerS = 0;///< Per-GPU NVLink bandwidth, one direction.
  double interNodeBytesPerS = 0;///< Per-GPU network bandwidth, one direction.
  double contextBytes = 0;      ///< CUDA context and NCCL buffers outside the allocator, per rank.
  /// Fraction of bf16Flops an MoE decoder layer's forward + backward
  /// reaches in adapt's runtime (router, permutation, elementwise and
  /// launch gaps included).
  double layerEfficiency = 0;
  /// The same for the LM head and fused loss.
  double headEfficiency = 0;
  /// Measured activation bytes kept per token per decoder layer, as a
  /// multiple of the planner's count of saved tensors (Planner.cpp).
  double activationScale = 1.0;
  /// Allocator bytes besides weights, adapters and layer activations
  /// (embedding output, loss chunk, workspace).
  double fixedAllocatorBytes = 0;
  /// Activation bytes per token per Gated DeltaNet / KDA layer of 4,096
  /// value channels with the delta rule's kernels (its inputs, gates,
  /// convolution and norm around it, each chunk's bf16 state), scaled by
  /// the layer's value width. Sequences longer than the runtime's segment
  /// (kDeltaRuleSegmentTokens) keep this for one segment of one layer at a
  /// time (the segments are recomputed).
  double deltaRuleBytesPerToken = 0;
  /// Seconds per token of one Gated DeltaNet layer (4,096 value channels)
  /// forward + backward beyond its projections' FLOPs (which layerFlops
  /// counts) and beyond the delta rule's op (deltaRuleOpSecondsPerToken, or
  /// Kimi's): the convolution, gates, norms and the layer's other passes.
  double deltaRuleLayerRestSecondsPerToken = 0;
  /// Seconds per token of lightning attention's core (the delta rule's
  /// kernels with W = 0) forward + backward at 64 heads x 128 (MiniMax's),
  /// flat in the tokens: memory and latency, not FLOPs, set it.
  double lightningSecondsPerToken = 0;
  /// Seconds per token of the delta rule's op alone (GDN, 32 heads x 128,
  /// forward + backward): what a rank waits for per token of the previous
  /// rank's part when CP passes the state on.
  double deltaRuleOpSecondsPerToken = 0;
  /// The same for Kimi's per-channel delta rule (KDA), 32 heads x 128.
  double kimiDeltaOpSecondsPerToken = 0;
  /// FLOP/s the DSA lightning indexer's scoring reaches (bf16 scores, per head, then reduced).
  double indexerFlops = 0;
};

/// The H200 this project measures on, with its sources.
const Hardware &h200();

} // namespace adapt::plan

#endif // ADAPT_PLANNER_HARDWARE_H
