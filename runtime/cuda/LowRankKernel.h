//===- LowRankKernel.h - add a per-expert rank-r product in place -*- C++ -*-===//
//
// The expert LoRA's up-projection (forward) and its input-gradient term
// (backward) are both out[row] += low[row] @ factor[expert(row)]^T with a
// rank of 8-32: a GEMM too thin for tensor cores, whose cost is writing its
// [rows, N] output. Here it accumulates straight into the base grouped
// GEMM's output, so the [rows, N] product and the add that followed it are
// gone. Built where nvcc is (ADAPT_WITH_CUDA_KERNELS); the composition in
// ExpertLinear::forward stays the CPU path and the reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_LOWRANKKERNEL_H
#define ADAPT_RUNTIME_CUDA_LOWRANKKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Ranks addLowRankRows handles: multiples of 8 up to 32 (a bf16 factor's
/// rows whole 16-byte vectors; two columns of it held in registers).
bool lowRankSupported(int64_t rank);

/// out[i, :] += low[i, :] @ factor[expertOfRow[i]]^T for every row i, in
/// fp32, rounded once into \p out. \p out [R, N], \p low [R, r] and \p factor
/// [E, N, r] are CUDA tensors of one dtype, N even; \p factor is contiguous,
/// \p out and \p low row-major with unit column stride (they may be column
/// ranges of wider buffers; out's row stride even); \p expertOfRow [R]
/// int64. r must satisfy lowRankSupported.
void addLowRankRows(at::Tensor &out, const at::Tensor &low, const at::Tensor &factor,
                    const at::Tensor &expertOfRow);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_LOWRANKKERNEL_H
