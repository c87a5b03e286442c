//===- RowNorm.cuh - a warp per row for the RMSNorm kernels ----*- C++ -*-===//
//
// The row-norm kernels (RmsNormKernel.cu, GatedNormKernel.cu, L2NormKernel.cu) give each row
// to one warp, which walks it in 16-byte packs (Packed.cuh): the rows are
// short (64-8,192 elements), and a block per row would leave most of it idle.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_ROWNORM_CUH
#define ADAPT_RUNTIME_CUDA_ROWNORM_CUH

#include "runtime/cuda/Packed.cuh"

#include <cstdint>

namespace adapt::rt::cuda::rownorm {

constexpr int kThreads = 256;                 ///< Threads per block.
constexpr int kRowsPerBlock = kThreads / 32;  ///< One row per warp.

/// The row this thread's warp takes: each block's kRowsPerBlock rows, a
/// warp each (past the last row when the block overhangs it).
__device__ __forceinline__ int64_t warpRow() { return blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32; }

/// The sum of \p v over the warp, in every lane.
__device__ __forceinline__ float warpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// sum(row^2) of the \p width elements at \p row, in every lane of the
/// warp (\p lane: this thread's).
template <typename T>
__device__ __forceinline__ float rowSquares(const T *row, int64_t width, int lane) {
  using P = Pack<T>;
  float squares = 0.0f;
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    const P v = P::load(row + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      squares += v.v[i] * v.v[i];
  }
  return warpSum(squares);
}

/// rsqrt(mean(row^2) + eps) of the \p width elements at \p row, in every
/// lane of the warp (\p lane: this thread's).
template <typename T>
__device__ __forceinline__ float rowRstd(const T *row, int64_t width, int lane, float eps) {
  return rsqrtf(rowSquares(row, width, lane) / static_cast<float>(width) + eps);
}

/// Blocks for \p rows rows.
inline int blocksFor(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

} // namespace adapt::rt::cuda::rownorm

#endif // ADAPT_RUNTIME_CUDA_ROWNORM_CUH
