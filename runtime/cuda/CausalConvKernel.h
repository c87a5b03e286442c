//===- CausalConvKernel.h - the short causal convolution + SiLU -*- C++ -*-===//
//
// Gated DeltaNet's and Kimi delta attention's depthwise causal convolution
// (kernel 2-4 over time) followed by SiLU, straight on the [B, T, C] rows the
// projections write: one read of x and one write of y forward, the
// pre-activation recomputed backward. The LibTorch composition in
// runtime/LinearAttention.cpp (causalConv1dSilu: a transpose to [B, C, T],
// conv1d, narrow, silu and a transpose back, each a pass over the tensor)
// stays the CPU path and the reference. On by default since the
// `causal_conv1d.silu` op checks passed on an H200 in bf16 and fp32
// (session 43); ADAPT_CONV_KERNEL=0 keeps the composition.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_CAUSALCONVKERNEL_H
#define ADAPT_RUNTIME_CUDA_CAUSALCONVKERNEL_H

#include <ATen/core/Tensor.h>

#include <utility>

namespace adapt::rt::cuda {

/// Whether causalConv1dSilu takes these kernels where they fit (ADAPT_CONV_KERNEL=0: never).
bool causalConvKernelEnabled();

/// Whether the kernels take \p x [B, T, C] (CUDA, contiguous, fp32/bf16/fp16)
/// with \p weight of C x K elements (K of 2, 3 or 4) on the same device.
bool causalConvTakes(const at::Tensor &x, const at::Tensor &weight);

/// y[b, t, c] = silu(sum_j w[c, j] x[b, t - K + 1 + j, c]) with x zero before
/// t = 0, accumulated in fp32 and rounded once to x's dtype; \p weight has C x
/// K elements ([C, K] or [C, 1, K]).
at::Tensor causalConvSilu(const at::Tensor &x, const at::Tensor &weight);

/// {dx in x's dtype, dw [C, K] fp32, or undefined unless \p weightGrad} of
/// causalConvSilu for the output's gradient \p gradOut [B, T, C]; the
/// pre-activation is recomputed from x. dw is summed over (batch, run of
/// time steps) partial sums in a fixed order: deterministic.
std::pair<at::Tensor, at::Tensor> causalConvSiluBackward(const at::Tensor &x, const at::Tensor &weight,
                                                         const at::Tensor &gradOut, bool weightGrad);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_CAUSALCONVKERNEL_H
