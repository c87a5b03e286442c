//===- RmsNormKernel.h - RMSNorm in one pass each way -----------*- C++ -*-===//
//
// y = x * rsqrt(mean(x^2) + eps) * (w + offset), fp32 inside and one rounding
// at the end, as LibTorch's fused rms_norm and the references' zero-centred
// norms (offset 1: Qwen3-Next, Gemma) compute it. One warp per row over
// 16-byte packs: the q/k norms run over rows of only 64-256 elements, where
// a block per row leaves most of the block idle. The backward gives the
// input's gradient only (the norm weights of a LoRA run are frozen; the
// caller adds the weight's gradient from the saved rstd when it is needed).
// Built where nvcc is (ADAPT_WITH_CUDA_KERNELS); runtime/Ops.cpp keeps the
// composition as the CPU path and the reference.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_RMSNORMKERNEL_H
#define ADAPT_RUNTIME_CUDA_RMSNORMKERNEL_H

#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>

namespace adapt::rt::cuda {

/// Whether the kernels take \p x with \p weight: a CUDA tensor of float,
/// bf16 or half whose last dim is packable, the weight undefined or [D].
bool rmsNormKernelFits(const at::Tensor &x, const at::Tensor &weight);

/// The normalised \p x (contiguous, last dim D) in x's dtype, and the fp32
/// rsqrt(mean(x^2) + eps) of each row ([rows]) for backward. \p weight
/// ([D], any float dtype) may be undefined: a unit scale.
std::pair<at::Tensor, at::Tensor> rmsNormForward(const at::Tensor &x, const at::Tensor &weight, double eps,
                                                 double offset);

/// {h, y, rstd} for h = \p residual + \p branch (same shape and dtype,
/// rounded to it as an add stores it) and y the norm of h, in one pass each
/// over the rows: the decoder's add before its norm without an extra pass.
std::tuple<at::Tensor, at::Tensor, at::Tensor> residualRmsNormForward(const at::Tensor &residual,
                                                                     const at::Tensor &branch,
                                                                     const at::Tensor &weight, double eps,
                                                                     double offset);

/// d x from d y, the saved \p rstd and the same \p weight and \p offset,
/// plus \p gradResidual (x's gradient along the residual stream, summed in
/// the same pass) when it is defined.
at::Tensor rmsNormBackward(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &rstd,
                           const at::Tensor &gradY, double offset, const at::Tensor &gradResidual = at::Tensor());

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_RMSNORMKERNEL_H
