//===- FactorLayoutKernel.h - expert LoRA factors between two layouts -*- C++ -*-===//
//
// PEFT stores the routed experts' up factor as B [N, r*E] (column k*E + e);
// the fused experts' GEMMs read s*B_e as the spare columns [E, N, r] of each
// expert's padded bf16 weight (runtime/FusedExperts.h). LibTorch's strided
// copy between the two (r innermost on one side, E on the other) moves 2
// bytes per scattered access: ~25-30 us per factor and direction at
// Qwen3-30B-A3B's shapes, ~0.1 ms per MoE layer with the casts and scalings
// around it. Here the forward's copy goes through a [r, 128-expert] tile in
// shared memory, with the scale and the dtype change folded in. Built where
// nvcc is (ADAPT_WITH_CUDA_KERNELS); FusedExperts.cpp keeps LibTorch's copy
// as the CPU path. (The factors' gradients come from K-grouped GEMMs in
// FusedExperts.cpp.)
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_FACTORLAYOUTKERNEL_H
#define ADAPT_RUNTIME_CUDA_FACTORLAYOUTKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// columns[e, n, k] = scale * factor[n, k*E + e]: \p factor [N, r*E] fp32
/// contiguous; \p columns [E, N, r] bf16 on the same device with unit stride
/// over r (the spare columns of a padded weight). Returns false, writing
/// nothing, where the shapes, dtypes or strides do not fit.
bool factorToExpertColumns(const at::Tensor &factor, double scale, at::Tensor columns);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_FACTORLAYOUTKERNEL_H
