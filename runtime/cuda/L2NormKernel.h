//===- L2NormKernel.h - the delta rule's query and key normalisation -*- C++ -*-===//
//
// Gated DeltaNet and Kimi delta attention normalise each head's query and key
// rows to unit length before the delta rule: y = x / sqrt(sum(x^2) + eps),
// in fp32 and rounded once to x's dtype (runtime/LinearAttention.cpp,
// l2Normalize). The LibTorch composition takes about seven passes forward
// (an fp32 copy, square, sum, add, rsqrt, multiply, the cast back) and as
// many backward, each over [B, T, heads, 128] (session 54's profile of
// Qwen3-Next's step: eighteen multiplies and twelve adds of that shape,
// ~2.1 ms of a 4-layer step on an H100). These kernels take one pass each
// way, a warp per row, reading x where it lies (the convolution's output,
// split into q, k and v by views: rows with strides) and keeping only x and
// each row's 1 / norm for the backward:
//   dx = r dy - x r^3 sum(dy x),   r = (sum(x^2) + eps)^(-1/2).
// On by default since its checks passed on an H100 (session 54: `norm.l2`
// and `norm.l2.strided` fp32 and bf16, `gated_delta_rule` and `kimi_delta`
// bf16, memcheck 0 errors; Qwen3-Next's 4-layer step 98.4K -> 103.2K
// tokens/s); ADAPT_L2NORM_KERNEL=0 keeps the composition.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_L2NORMKERNEL_H
#define ADAPT_RUNTIME_CUDA_L2NORMKERNEL_H

#include <ATen/core/Tensor.h>

#include <utility>

namespace adapt::rt::cuda {

/// Whether l2Normalize takes these kernels where they fit (ADAPT_L2NORM_KERNEL=0: never).
bool l2NormKernelEnabled();

/// Whether the kernels take \p x: CUDA fp32/bf16/fp16 with at most four
/// dimensions, the last contiguous, a multiple of 16 bytes and at most 8,192
/// elements, every other stride and the data 16-byte aligned.
bool l2NormFits(const at::Tensor &x);

/// {y contiguous in x's dtype and shape, r [rows] fp32 (each row's 1 / norm)}.
std::pair<at::Tensor, at::Tensor> l2NormForward(const at::Tensor &x, double eps);

/// dx (contiguous, x's dtype) from \p gradY (any strides l2NormFits takes,
/// else copied) and the forward's x and r.
at::Tensor l2NormBackward(const at::Tensor &x, const at::Tensor &r, const at::Tensor &gradY);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_L2NORMKERNEL_H
