//===- PerChannelScoresKernel.h - Kimi's decayed scores on the GPU -*- C++ -*-===//
//
// The pairwise products of the delta rule with a decay per key channel, and
// their gradient, as one kernel each over whole chunks (fp32): what
// runtime/KimiDeltaFunction.cpp's perChannelDecayedScores and its backward
// compute with sub-chunk tensors. On by default since the `kimi_scores` and
// `kimi_delta.*` op checks passed on an H200 in bf16 and fp32 (session 43);
// ADAPT_KIMI_SCORES_KERNEL=0 keeps the composition.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_PERCHANNELSCORESKERNEL_H
#define ADAPT_RUNTIME_CUDA_PERCHANNELSCORESKERNEL_H

#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>

namespace adapt::rt::cuda {

/// Whether the Kimi node's scores take these kernels (ADAPT_KIMI_SCORES_KERNEL=0: never).
bool perChannelScoresKernelEnabled();

/// Whether the kernels take \p x, \p y and \p cum: CUDA fp32, the same
/// shape [.., c, dk] with c <= 64 and 32 <= dk <= 128.
bool perChannelScoresTakes(const at::Tensor &x, const at::Tensor &y, const at::Tensor &cum);

/// Whether the scores and their gradients take the sub-chunk kernels:
/// blocks of 16 rows, an exponential per term only on the diagonal blocks,
/// the blocks below as products of rows scaled to the block row's first
/// (the default since session 49's checks on an H100;
/// ADAPT_KIMI_SCORES_SUBCHUNKS=0: the thread-per-pair kernels).
bool scoresSubchunksEnabled();

/// P [.., c, c]: P[t][i] = sum_d x_td y_id e^{cum_td - cum_id} for i <= t,
/// zero above the diagonal. Blocks of 16 rows by default (scoresSubchunksEnabled);
/// without them a thread per pair, or with ADAPT_KIMI_SCORES_PAIRS=0 a warp per pair.
at::Tensor perChannelScores(const at::Tensor &x, const at::Tensor &y, const at::Tensor &cum);

/// {dx, dy} [.., c, dk] of perChannelScores for the cotangent \p grad [.., c, c]
/// (its part above the diagonal is ignored).
std::pair<at::Tensor, at::Tensor> perChannelScoresBackward(const at::Tensor &grad, const at::Tensor &x,
                                                           const at::Tensor &y, const at::Tensor &cum);

/// Whether the Kimi node's backward takes perChannelScoresPairedBackward
/// (the default since session 46's op checks on an H100: Kimi forward +
/// backward at 1 x 32 x 32K 62.2 -> 60.2 ms; ADAPT_KIMI_SCORES_PAIRED_BACKWARD=0
/// takes two perChannelScoresBackward calls).
bool pairedScoresBackwardEnabled();

/// perChannelScoresBackward(gradA, xA, y, cum) and (gradB, xB, y, cum) in
/// one kernel, their y gradients summed: {dxA, dxB, dyA + dyB}, each
/// [.., c, dk]. Each e^{cum_t - cum_i} is computed once for both (Kimi's
/// backward: its output scores and its system).
std::tuple<at::Tensor, at::Tensor, at::Tensor> perChannelScoresPairedBackward(const at::Tensor &gradA, const at::Tensor &xA,
                                                    const at::Tensor &gradB, const at::Tensor &xB, const at::Tensor &y,
                                                    const at::Tensor &cum);

/// Whether perChannelScoresPairedBackwardBf16Keys takes these: CUDA bf16
/// \p query and \p key and fp32 \p cum alike [.., c <= 64, dk] (32 <= dk <=
/// 128, a multiple of 4), fp32 \p beta [.., c, 1].
bool pairedScoresBf16KeysTake(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                              const at::Tensor &cum);

/// perChannelScoresPairedBackward for Kimi's backward with xA = q scale,
/// xB = k b and y = k formed in the kernel from the node's bf16 \p query
/// and \p key (chunked, unscaled) and fp32 \p beta, each value as the
/// fp32 copies' (float(q) queryScale, float(k), float(k) b): those three
/// [.., c, dk] fp32 tensors are never written. Returns {dxA, dxB, dy}, fp32.
/// At c 64, dk 128 the blocks below the diagonal run on TF32 tensor cores
/// (runtime/cuda/PairedScoresMmaKernel.cu; ADAPT_KIMI_SCORES_MMA=0: the
/// scalar kernel's fp32 products).
std::tuple<at::Tensor, at::Tensor, at::Tensor> perChannelScoresPairedBackwardBf16Keys(
    const at::Tensor &gradA, const at::Tensor &gradB, const at::Tensor &query, const at::Tensor &key,
    const at::Tensor &beta, const at::Tensor &cum, double queryScale);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_PERCHANNELSCORESKERNEL_H
