//===- RopeKernel.h - rotary embedding in one pass each way -----*- C++ -*-===//
//
// The composition in applyRope (runtime/Ops.cpp) builds the rotated copy with
// a cat, casts the tables, and makes three more passes (two multiplies and an
// add, one more cat where only part of the head rotates); its backward as
// many again. Here each element is read and written once in fp32, forward
// and backward. Built where nvcc is (ADAPT_WITH_CUDA_KERNELS); the
// composition stays the CPU path and the reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_ROPEKERNEL_H
#define ADAPT_RUNTIME_CUDA_ROPEKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Rotates the first rot = cos.size(1) dims of \p x [B, H, T, D] (any strides
/// with a unit last stride) by the tables \p cos and \p sin [T, rot] (fp32,
/// unit last stride): pairs (i, i + rot/2), or (2i, 2i+1) when \p interleaved.
/// With \p adjoint, the transposed rotation instead (the backward: the
/// gradient of x from the output's). Dims past rot are copied. Returns a
/// tensor with x's layout.
at::Tensor rotary(const at::Tensor &x, const at::Tensor &cos, const at::Tensor &sin, bool interleaved,
                  bool adjoint);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_ROPEKERNEL_H
