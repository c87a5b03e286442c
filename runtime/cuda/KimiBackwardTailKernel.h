//===- KimiBackwardTailKernel.h - Kimi's backward sums in one pass -*- C++ -*-===//
//
// The last step of Kimi delta attention's backward (runtime/KimiDeltaFunction.cpp):
// the query, key and cumulative-decay gradients and the key terms of beta's,
// each a sum of products of the chunk tensors [.., c, dk] with e^G and
// e^{G_last - G}. The composition makes ~25 fp32 passes over [.., c, dk]
// (the profile at 1 x 32 heads x 8K on an H100: ~2.7 ms of elementwise
// kernels); this kernel reads its nine chunk inputs once and writes three outputs,
// the exponentials computed from G in registers. A block per chunk, a thread
// per key channel. On by default since session 45's checks on an H100 (fp32
// and bf16, memcheck); ADAPT_KIMI_BACKWARD_TAIL_KERNEL=0 keeps the composition.
// KDA forward + backward at 1 x 32 heads x 32K: 62.0 -> 53.0 ms.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_KIMIBACKWARDTAILKERNEL_H
#define ADAPT_RUNTIME_CUDA_KIMIBACKWARDTAILKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether the Kimi node's backward takes the tail kernel (on unless ADAPT_KIMI_BACKWARD_TAIL_KERNEL=0).
bool kimiBackwardTailEnabled();

/// Whether the tail kernel also finishes the log decays' gradient (the
/// suffix sums within the chunk and the chunk's last G's terms) in place of
/// LibTorch's flip, cumsum and flip: ~1.7 ms of KDA's 47.4 at 1 x 32 heads x
/// 32K (session 47's profile, H100). The default since its op checks passed
/// on an H100 in session 48 (KDA forward + backward 46.9 -> 45.9 ms at 32K,
/// peak 12.3 -> 11.9 GiB); ADAPT_KIMI_TAIL_DECAY_GRADIENT=0 takes LibTorch's.
bool kimiTailDecayGradientEnabled();

/// Whether the kernel takes chunk tensors like \p key: CUDA fp32 or bf16
/// [.., c, dk] with c <= 64 and dk <= 128.
bool kimiBackwardTailTakes(const at::Tensor &key);

/// The tail's results, fp32 but for dq and dk (the asked-for rows type).
struct KimiBackwardTail {
  at::Tensor query;         ///< dq [.., c, dk] (times the query's scale).
  at::Tensor key;           ///< dk [.., c, dk].
  at::Tensor cum;           ///< d G [.., c, dk], before the chunk-last terms; the log decays' gradient when decayGradient.
  at::Tensor betaKeys;      ///< beta's key terms, summed over dk [.., c, 1].
  at::Tensor keysToEndSums; ///< sum over the chunk's rows of dKd * Kd [.., 1, dk] (undefined when decayGradient).
  bool decayGradient = false; ///< Whether cum holds dg itself (leavingDotState was given).
};

/// With G = \p cum, L = G's last row, gamma = e^G, toEnd = e^{L - G} and
/// beta = \p beta [.., c, 1], for the scaled query \p q and key \p k:
///   dq   = (dqScores + dQueryDecayed gamma) scale
///   dk   = dKeysBeta beta + dkColumns + dXk beta gamma + dKeysToEnd toEnd
///   dG   = q dqScores + k (dKeysBeta beta - dkColumns) + dQueryDecayed q gamma
///          + dXk k beta gamma - dKeysToEnd k toEnd
///   betaKeys = sum_d (dKeysBeta k + dXk k gamma)
///   keysToEndSums = sum_rows dKeysToEnd k toEnd
/// \p dkColumns is the keys' column gradient of both score products (the
/// output's and the system's, summed: pairedDecayedScoresBackward). Every
/// tensor [.., c, dk] but \p beta; all fp32 on one CUDA device. Given \p
/// leavingDotState (sum_v dS' . S per key channel [.., 1, dk]), cum is the
/// log decays' gradient itself: dg_t = sum_{t' >= t} dG_t' + keysToEndSums
/// + leavingDotState e^L. dq and dk go out as \p rowsType (fp32 or bf16:
/// rounded once, as the casts to the inputs' dtype after would round them).
/// \p q and \p k may instead be the node's bf16 inputs (chunked, unscaled):
/// the kernel widens them as it reads, q times \p scale, each value as the
/// fp32 copies'; the other tensors stay fp32.
KimiBackwardTail kimiBackwardTail(const at::Tensor &q, const at::Tensor &k, const at::Tensor &cum,
                                  const at::Tensor &beta, const at::Tensor &dqScores, const at::Tensor &dQueryDecayed,
                                  const at::Tensor &dKeysBeta, const at::Tensor &dkColumns,
                                  const at::Tensor &dXk, const at::Tensor &dKeysToEnd, double scale,
                                  const at::Tensor &leavingDotState = at::Tensor(),
                                  at::ScalarType rowsType = at::kFloat);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_KIMIBACKWARDTAILKERNEL_H
