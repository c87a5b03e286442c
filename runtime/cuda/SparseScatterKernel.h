//===- SparseScatterKernel.h - sparse attention's key-gradient scatter -*- C++ -*-===//
//
// The backward of attention over selected keys gives each (query, slot) pair
// a gradient row for the key it selected; rows of one key, chosen by many
// queries, are summed. In LibTorch that is a cast of the rows to fp32, an
// add of the values' part into the keys' (MLA's latents are both), and
// index_add_: three passes over [queries x k, 576] per block. Here one pass
// reads the bf16 rows and adds them into the fp32 accumulator with 16-byte
// atomics. Built where nvcc is (ADAPT_WITH_CUDA_KERNELS); the composition
// in runtime/SparseAttention.cpp stays the CPU path and the reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_SPARSESCATTERKERNEL_H
#define ADAPT_RUNTIME_CUDA_SPARSESCATTERKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// accumulator[rows[i], :] += keyGrads[i, :], plus valueGrads[i, :] on the
/// first Dv columns when \p valueGrads is defined. \p accumulator [S, D]
/// fp32 contiguous; \p keyGrads [N, D] and \p valueGrads [N, Dv <= D] of one
/// dtype (bf16, fp16 or fp32), contiguous; \p rows [N] int64 in [0, S).
/// Returns false, changing nothing, where the shapes or dtypes do not fit.
bool scatterAddKeyGradients(at::Tensor &accumulator, const at::Tensor &rows, const at::Tensor &keyGrads,
                            const at::Tensor &valueGrads);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_SPARSESCATTERKERNEL_H
