//===- FusedIndexerKernel.h - the lightning indexer in one kernel -*- C++ -*-===//
//
// DeepSeek sparse attention's indexer scores key j for query t as
// sum_h w[t, h] * relu(q[t, h] . k[j]). IndexerKernel.h does it as a bf16
// GEMM that writes every per-head score ([queries, heads, keys] bf16) and a
// kernel that reads them back: at 128K tokens and 64 heads that tile is
// ~2.2 TB of traffic per layer. This kernel computes the per-head products
// on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulation) and applies
// relu, the head weights and the head sum to the accumulators in registers,
// so only the [queries, keys] fp32 result is written. Each head's score also
// stays fp32 (the two-pass path rounds it to bf16 once).
//
// Layout: a block of 4 warps, one query each, walks 512 keys in tiles of 64
// held in shared memory; a warp keeps its query's [heads, dim] as mma A
// fragments in registers for the whole walk. Built where nvcc is
// (ADAPT_WITH_CUDA_KERNELS); runtime/SparseAttention.cpp picks it when
// fusedIndexerTakes says so and keeps the two-pass path and the fp32
// composition otherwise.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_FUSEDINDEXERKERNEL_H
#define ADAPT_RUNTIME_CUDA_FUSEDINDEXERKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether fusedIndexerScores takes \p q [n, H, D] and \p k [S, D]: CUDA
/// bf16, H in {16, 32, 64}, D in {32, 64, 128}, unit stride in D with even
/// query and head strides, k's rows contiguous and 16-byte aligned.
bool fusedIndexerTakes(const at::Tensor &q, const at::Tensor &k);

/// index[t, j] = sum_h weights[t, h] * relu(q[t, h] . k[j]) for keys j at
/// most \p firstPosition + t, -inf after. \p weights [n, H] fp32 contiguous
/// (any positive scale of the scores already folded in). Returns [n, S] fp32.
at::Tensor fusedIndexerScores(const at::Tensor &q, const at::Tensor &k, const at::Tensor &weights,
                              int64_t firstPosition);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_FUSEDINDEXERKERNEL_H
