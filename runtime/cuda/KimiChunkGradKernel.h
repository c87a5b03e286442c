//===- KimiChunkGradKernel.h - Kimi's chunk gradients in one kernel -*- C++ -*-===//
//
// The middle of Kimi delta attention's backward (runtime/KimiDeltaFunction.cpp),
// between the state gradient and the score gradients: seven products of
// each chunk's [64, 128] and [128, 128] tiles, which the composition runs as
// batched fp32 matmuls over tensors it first converts to fp32 (the saved bf16
// states and V_new, and the state kernel's dS' and dV_new: at 1 x 32 heads x
// 32K tokens dS' alone is 1 GiB in fp32). One block per chunk does them all
// from bf16 tiles with fp32 accumulation, the precision of GDN's backward
// kernels (runtime/cuda/DeltaRuleChunkBackwardKernel.cu). Written in
// session 47 and checked on an H100 the same session (kimi_delta in bf16,
// memcheck 0 errors): on by default, ADAPT_KIMI_CHUNK_GRAD_KERNEL=0 keeps
// the composition. KDA forward + backward at 1 x 32 heads x 32K: 52.6 ->
// 47.1 ms.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_KIMICHUNKGRADKERNEL_H
#define ADAPT_RUNTIME_CUDA_KIMICHUNKGRADKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether the Kimi node's backward takes the chunk-gradient kernel (on
/// unless ADAPT_KIMI_CHUNK_GRAD_KERNEL=0).
bool kimiChunkGradientsEnabled();

/// Whether the Kimi node's backward hands the kernels bf16 operands where
/// they read bf16 anyway: dO as it arrives to this kernel and the state
/// pass, P^T dO from the saved bf16 scores (fp32 sums), k e^{G_last - G}
/// and q e^G from the terms kernel in bf16, and dq and dk from the tail
/// kernel in bf16. At 1 x 32 heads x 8K that drops ~1.4 GiB of fp32
/// traffic, the copies and casts of session 54's profile. The default since
/// session 55's checks on an H100 (kimi_delta bf16 and fp32, memcheck 0
/// errors): KDA forward + backward 8.29-8.37 -> 7.60-7.65 ms at 1 x 32 x 8K,
/// peak 3.07 -> 2.82 GiB; ADAPT_KIMI_BF16_OPERANDS=0 opts out.
bool kimiBf16OperandsEnabled();

/// Whether the kernel takes these operands: CUDA, chunk 64, d 128, bf16 or
/// fp32 \p gradOut [b, h, n, 64, 128] and bf16 \p states [b, h, n, 128, 128] (the
/// forward kernels' saved states; the state gradients come after this test).
bool kimiChunkGradientsTake(const at::Tensor &gradOut, const at::Tensor &states);

/// The kernel's results, fp32 and contiguous, [b, h, n, 64, 128] unless noted.
struct KimiChunkGrads {
  at::Tensor queryDecayed;    ///< dQd = dO S^T.
  at::Tensor scores;          ///< dP = dO V_new^T on and below the diagonal [.., 64, 64].
  at::Tensor keysToEnd;       ///< dKd = V_new dS'^T.
  at::Tensor keysWeighted;    ///< dXk = T^T dW, with dW = -dV_new S^T.
  at::Tensor valuesWeighted;  ///< dXv = T^T dV_new (undefined when v was given).
  at::Tensor values;          ///< v's gradient dXv b, bf16 (when v was given).
  at::Tensor betaValues;      ///< beta's value term sum_v dXv v [.., 64, 1] (when v was given).
  at::Tensor system;          ///< dA = -(T^T dT T^T) strictly below the diagonal, dT = dW Xk^T + dV_new Xv^T [.., 64, 64].
  at::Tensor leavingDotState; ///< sum over v of dS' . S per key channel [.., 1, 128].
};

/// Per chunk of \p gradOut (dO, bf16 or fp32: bf16 as the output's
/// gradient arrives spares its fp32 copy), \p states (S entering the chunk,
/// bf16), \p newValues (V_new, bf16 [.., 64, 128]), \p leaving (dS' of the
/// state leaving it, [.., 128, 128]) and \p gradNew (dV_new [.., 64, 128]),
/// both bf16 or both fp32, \p keysWeighted (Xk = b k e^G) and \p
/// valuesWeighted (Xv = b v), fp32, and \p inverse (T = (I + A)^-1, fp32 [..,
/// 64, 64]): the products KimiChunkGrads names, from bf16 tiles with fp32
/// accumulation. Given \p values (v, bf16 [.., 64, 128]) and \p beta (b,
/// fp32 [.., 64, 1]), dXv's two uses come out of the kernel instead of dXv
/// (an fp32 [.., 64, 128] write, then two passes over it): v's gradient
/// dXv b in bf16, rounded once as the cast of the fp32 product rounds it,
/// and beta's value term sum_v dXv v; \p valuesWeighted may then be
/// undefined: the kernel forms Xv's bf16 tile from v and b itself, rounded
/// as the fp32 product's (an fp32 [.., 64, 128] write and read spared).
KimiChunkGrads kimiChunkGradients(const at::Tensor &gradOut, const at::Tensor &states, const at::Tensor &newValues,
                                  const at::Tensor &leaving, const at::Tensor &gradNew, const at::Tensor &keysWeighted,
                                  const at::Tensor &valuesWeighted, const at::Tensor &inverse,
                                  const at::Tensor &values = at::Tensor(), const at::Tensor &beta = at::Tensor());

/// Whether the Kimi node's backward has the chunk-gradient kernel take dXv's
/// two uses (v's gradient, beta's value term) in its epilogue, with bf16
/// operands only. The default since session 55's checks on an H100
/// (kimi_delta bf16, memcheck 0 errors): KDA forward + backward 7.43-7.45 ->
/// 7.15-7.17 ms at 1 x 32 x 8K; ADAPT_KIMI_VALUE_TERMS=0 opts out.
bool kimiValueTermsEnabled();

/// Whether the Kimi node's backward, with the value terms and every kernel
/// after the state pass, hands the terms, paired score-gradient and tail
/// kernels q and k as the bf16 inputs themselves, and this kernel v: each
/// forms q scale, k, k b and v b as it reads them, each value as the fp32
/// copies' (which are then never made: at 1 x 32 heads x 8K four [.., 64,
/// 128] fp32 tensors of 128 MiB, each written once and read two or three
/// times). The default since session 56's checks on an H100 (kimi_delta
/// bf16 with session 55's errors to three digits, fp32 <= 1.07e-6, memcheck
/// 0 errors): KDA forward + backward 7.18-7.22 -> 6.69 ms at 1 x 32 x 8K,
/// peak 2.76 -> 2.26 GiB; ADAPT_KIMI_BF16_ROWS=0 opts out.
bool kimiBf16RowsEnabled();

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_KIMICHUNKGRADKERNEL_H
