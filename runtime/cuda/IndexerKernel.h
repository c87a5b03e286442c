//===- IndexerKernel.h - the lightning indexer's head reduction -*- C++ -*-===//
//
// DeepSeek sparse attention's indexer scores key j for query t as
// sum_h w[t, h] * relu(q[t, h] . k[j]). The per-head dot products are one
// bf16 GEMM (tensor cores, fp32 accumulation); this kernel then reads each
// per-head score once, applies relu, the head weights and the causal mask,
// and writes one fp32 score per (query, key), where the composition made a
// relu pass and a batched GEMM over [queries, heads, keys]. Built where nvcc
// is (ADAPT_WITH_CUDA_KERNELS); runtime/SparseAttention.cpp keeps the fp32
// composition for the CPU and fp32 inputs.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_INDEXERKERNEL_H
#define ADAPT_RUNTIME_CUDA_INDEXERKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// index[t, j] = sum_h weights[t, h] * relu(headScores[t, h, j]) for keys j
/// at most \p firstPosition + t, -inf after. \p headScores [n, H, S]
/// contiguous (bf16 or fp32), \p weights [n, H] fp32 contiguous (any positive
/// scale of the scores already folded in). Returns [n, S] fp32.
at::Tensor indexerScores(const at::Tensor &headScores, const at::Tensor &weights, int64_t firstPosition);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_INDEXERKERNEL_H
