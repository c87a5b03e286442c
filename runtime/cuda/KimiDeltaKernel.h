//===- KimiDeltaKernel.h - the delta rule with a decay per key channel -*- C++ -*-===//
//
// Kimi Delta Attention's chunked delta rule (a log decay per head, token and
// key channel) as three tensor-core kernels, the decomposition of
// DeltaRuleKernel.h with the decay inside the key products:
//   1. per chunk: G = cumsum(g) per channel; A = strictly-lower(beta_t
//      sum_d k_td k_id e^{G_td - G_id}) by sub-chunks of 16 (pairs within
//      a sub-chunk exactly, pairs across through the key sub-chunk's last
//      G, so that no factor exceeds 1); T = (I + A)^-1; W = T (beta k e^G),
//      U = T (beta v), and the keys decayed to the chunk's end;
//   2. the state recurrence (DeltaRuleState.cuh), row d of the state
//      decaying by e^{G_last, d};
//   3. per chunk: O = (q e^G) S_n + causal(sum_d q_td k_id e^{G_td - G_id})
//      V_new, the scores by the same sub-chunks.
// The forward without a graph takes it (the `kimi_delta.no_grad` op checks
// pass on an H100, bf16 3.4e-3 against 2.5e-2, memcheck clean; the state
// kernel's prefetching form since its checks passed on an H200 in session 43,
// ADAPT_KIMI_DELTA_PREFETCH=0 keeps the plain one);
// ADAPT_KIMI_DELTA_KERNEL=0 keeps the LibTorch composition, the reference.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_KIMIDELTAKERNEL_H
#define ADAPT_RUNTIME_CUDA_KIMIDELTAKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether the forward without a graph takes the kernels: yes unless ADAPT_KIMI_DELTA_KERNEL=0.
bool kimiDeltaKernelEnabled();

/// Whether training's forward (KimiDeltaNode) takes them too, handing T, the
/// states and V_new to its backward: on since the d-128 `kimi_delta.chunked`
/// and `kimi_delta.segmented` op checks passed on an H200 (session 43);
/// ADAPT_KIMI_DELTA_TRAIN_KERNEL=0 keeps the composition in training.
bool kimiDeltaTrainingKernelEnabled();

/// Whether kimiDeltaRuleForward takes these inputs: CUDA bf16 \p query,
/// \p key and \p value [B, H, T, 128] with packable rows, \p decay [B, H, T,
/// 128] and \p beta [B, H, T] of any float dtype, chunk 64.
bool kimiDeltaRuleForwardTakes(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                               const at::Tensor &decay, const at::Tensor &beta, int64_t chunkSize);

/// What the training backward (runtime/KimiDeltaFunction.cpp) reads from
/// the forward kernels, chunks padded to whole 64-token chunks.
struct KimiDeltaSaved {
  at::Tensor inverse;   ///< T = (I + A)^-1 per chunk, fp32 [B·H, n·64, 64].
  at::Tensor states;    ///< Each chunk's entering state, bf16 [B·H, n, 128, 128].
  at::Tensor newValues; ///< V_new, bf16 [B·H, n·64, 128].
  /// With kimiSavedScoresEnabled: the output's causal scores as the output
  /// kernel used them, scale sum_d q_td k_id e^{G_td - G_id} (zero above the
  /// diagonal), bf16 [B·H, n·64, 64]; else undefined.
  at::Tensor scores;
};

/// Whether the training forward hands the backward its output scores
/// (KimiDeltaSaved::scores, 8 KiB per chunk and head), so that the backward
/// reads them instead of rebuilding them in fp32 (the `kimi_scores.forward`
/// pass: ~1.0 ms of Kimi's 11.3 at 1 x 32 x 8K on an H100). The backward then
/// differentiates the scores the forward used, rounded to bf16 as the output
/// product took them. The default since the `kimi_delta` bf16 op checks
/// passed with it on an H100 (session 49: 3.5e-3 against 2.5e-2; KDA forward +
/// backward 11.48 -> 10.45 ms at 8K, 46.37 -> 42.91 at 32K, peak +0.13 GiB
/// there); ADAPT_KIMI_SAVED_SCORES=0 rebuilds them.
bool kimiSavedScoresEnabled();

/// The output [B, H, T, 128] (bf16; the query scaled by 1/sqrt(128)
/// inside); \p initialState [B, H, 128, 128] fp32 may be undefined (zeros);
/// \p finalState, if given, receives S_T in fp32; \p saved, if given, what
/// the backward reads.
at::Tensor kimiDeltaRuleForward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                const at::Tensor &decay, const at::Tensor &beta, const at::Tensor &initialState,
                                at::Tensor *finalState, KimiDeltaSaved *saved = nullptr);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_KIMIDELTAKERNEL_H
