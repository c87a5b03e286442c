//===- SwiGluKernel.h - SwiGLU on a fused gate/up projection -*- C++ -*-===//
//
// Built where nvcc is (ADAPT_WITH_CUDA_KERNELS); the LibTorch composition in
// runtime/Ops.cpp (gatedActivation) stays the CPU path and the reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_SWIGLUKERNEL_H
#define ADAPT_RUNTIME_CUDA_SWIGLUKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// silu(gate) * up over \p gateUp [rows, 2W] (CUDA, contiguous; gate in the
/// first W columns), computed in fp32 and stored in gateUp's dtype: [rows, W].
at::Tensor swiGluForward(const at::Tensor &gateUp);

/// swiGluForward written into \p out [rows, W], whose rows may be the first
/// W columns of a wider buffer (unit column stride): the fused experts' node
/// writes the activation beside its LoRA columns (FusedExperts.h).
void swiGluForwardInto(const at::Tensor &gateUp, at::Tensor out);

/// The gradient of swiGluForward with respect to \p gateUp, given the
/// output's gradient \p gradOut [rows, W]: [rows, 2W] in one pass.
at::Tensor swiGluBackward(const at::Tensor &gateUp, const at::Tensor &gradOut);

/// swiGluBackward written into \p grad [rows, 2W]; \p gradOut [rows, W] and
/// \p grad may each be column ranges of wider buffers (unit column stride).
void swiGluBackwardInto(const at::Tensor &gateUp, const at::Tensor &gradOut, at::Tensor grad);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_SWIGLUKERNEL_H
