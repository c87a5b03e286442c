//===- OuterSumKernel.h - LoRA weight gradients of grouped rows -*- C++ -*-===//
//
// The routed experts' four LoRA weight gradients are sums over each
// expert's rows of an outer product of a rank-r row and a wide row:
// d A_e = sum_i dLow[i]^T x[i], d B_e = sum_i dh[i]^T low[i]. As K-grouped
// GEMMs (at::_grouped_mm with the rows as the reduction) their output tiles
// are 16 wide and they reach ~15 TFLOP/s: 0.49 ms of a 9 ms MoE layer at
// Qwen3-30B-A3B's shapes on the H200 (docs/performance.md, seventh round),
// where reading the wide rows once takes ~0.07 ms each. Here a block owns
// one expert and 128 columns, a thread one column's r sums in registers;
// the rank-r rows are staged in shared memory. The sums are written scaled,
// in fp32, straight into the adapter's gradient in PEFT's layout (strides
// given), so no cast or transpose follows. Built where nvcc is
// (ADAPT_WITH_CUDA_KERNELS); FusedExperts.cpp keeps the grouped GEMMs as
// the CPU path and the reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_OUTERSUMKERNEL_H
#define ADAPT_RUNTIME_CUDA_OUTERSUMKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// For every expert e and k < r, n < N:
///   out[e*sE + k*sK + n*sN] = scale * sum over rows i of group e of narrow[i, k] * wide[i, n]
/// with groups by \p offsets ([E] int32 cumulative row ends). \p narrow [R,
/// r] and \p wide [R, N] are bf16 CUDA tensors with unit column stride (they
/// may be column ranges of wider buffers); \p out fp32, its strides (sE, sK,
/// sN) passed, covering E*r*N elements. r a multiple of 8 up to 32. Returns
/// false, writing nothing, where these do not hold.
bool groupedOuterSum(const at::Tensor &narrow, const at::Tensor &wide, const at::Tensor &offsets, double scale,
                     at::Tensor &out, int64_t strideExpert, int64_t strideRank, int64_t strideColumn);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_OUTERSUMKERNEL_H
