//===- GatedNormKernel.h - the linear-attention output's gated norm -*- C++ -*-===//
//
// The norm between the delta rule and the output projection, per head row:
//   Qwen3-Next (Qwen3NextRMSNormGated): y = w * rmsnorm(x) * silu(gate),
//   Kimi-Linear (KimiLinearRMSNormGated): y = w * rmsnorm(x) * sigmoid(gate),
// in one pass each way: fp32 inside, one rounding at the end (the references
// round rmsnorm(x) to x's dtype before the weight in Qwen3-Next's form; the
// op checks' float64 reference bounds both). The LibTorch compositions in
// runtime/LinearAttention.cpp (gatedRmsNorm, sigmoidGatedRmsNorm: eight or so
// passes, several fp32 copies kept for backward) stay the CPU path and the
// reference. On by default since the `norm.gated_rms*` op checks passed on
// an H200 in bf16 (session 43); ADAPT_GATED_NORM_KERNEL=0 keeps the
// composition. The backward
// gives x's and the gate's gradients; the caller adds the (frozen in LoRA
// runs) weight's from the saved rstd when it is needed.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_GATEDNORMKERNEL_H
#define ADAPT_RUNTIME_CUDA_GATEDNORMKERNEL_H

#include <ATen/core/Tensor.h>

#include <utility>

namespace adapt::rt::cuda {

/// The gate's activation.
enum class NormGate { Silu, Sigmoid };

/// Whether the gated norms take these kernels where they fit (ADAPT_GATED_NORM_KERNEL=0: never).
bool gatedNormKernelEnabled();

/// Whether the kernels take \p x and \p gate (CUDA, one shape, one dtype of
/// fp32/bf16/fp16, last dim D a multiple of 16 bytes) with \p weight [D].
bool gatedNormFits(const at::Tensor &x, const at::Tensor &gate, const at::Tensor &weight);

/// {y in x's dtype, rstd [rows] fp32}: y = w * x * rstd * act(gate) per row
/// of D, rstd = rsqrt(mean(x^2) + eps).
std::pair<at::Tensor, at::Tensor> gatedNormForward(const at::Tensor &x, const at::Tensor &gate,
                                                   const at::Tensor &weight, double eps, NormGate kind);

/// {dx, dgate} in x's dtype from \p gradY and the forward's saved rstd.
std::pair<at::Tensor, at::Tensor> gatedNormBackward(const at::Tensor &x, const at::Tensor &gate,
                                                    const at::Tensor &weight, const at::Tensor &rstd,
                                                    const at::Tensor &gradY, NormGate kind);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_GATEDNORMKERNEL_H
