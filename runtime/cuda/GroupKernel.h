//===- GroupKernel.h - token-expert pairs grouped by expert, stably -*- C++ -*-===//
//
// groupByExpert (runtime/Ops.h) sorts the N*k (token, expert) pairs by
// expert, keeping token order within an expert, and pads each expert's
// rows to the grouped GEMM's alignment. As LibTorch ops that is a 64-bit
// radix sort and ~25 small kernels, ~0.1 ms per MoE layer at 65,536 pairs
// on the H200. Here it is a stable counting sort in three kernels: each
// chunk of pairs counts its experts; one block turns the counts into every
// chunk's first row per expert (and writes the padding rows); each chunk
// then places its pairs in order, a warp at a time. The result is the
// composition's, element for element. Built where nvcc is
// (ADAPT_WITH_CUDA_KERNELS).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_GROUPKERNEL_H
#define ADAPT_RUNTIME_CUDA_GROUPKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// groupByExpert's tensors (runtime/Ops.h, ExpertGroups).
struct GroupedPairs {
  at::Tensor tokenOfRow, weightOfRow, expertOfRow, offsets, rowCounts, counts, rowOfPair;
};

/// Whether groupPairs takes \p experts ([N, k] int64 CUDA) over \p count
/// experts: at most 1,024 of them, and at least one pair.
bool groupKernelFits(const at::Tensor &experts, int64_t count);

/// The pairs of \p experts [N, k] with \p weights [N, k] fp32 grouped as
/// groupByExpert(routing, count, align) groups them.
GroupedPairs groupPairs(const at::Tensor &experts, const at::Tensor &weights, int64_t count, int64_t align);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_GROUPKERNEL_H
