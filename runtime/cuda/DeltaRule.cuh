//===- DeltaRule.cuh - tiles shared by the delta rule's kernels -----------===//
//
// The chunk's widths and the tile helpers of the forward
// (DeltaRuleKernel.cu) and backward (DeltaRuleBackwardKernel.cu) kernels:
// bf16 tiles in shared memory with rows padded by 8 elements (16 bytes), so
// fragment loads of consecutive rows fall in different banks, and mma.sync
// m16n8k16 fragments (Mma.cuh) loaded from them.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_DELTARULE_CUH
#define ADAPT_RUNTIME_CUDA_DELTARULE_CUH

#include "runtime/cuda/Mma.cuh"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace adapt::rt::cuda::delta {

using bf16 = __nv_bfloat16;

constexpr int kChunk = 64;         ///< Tokens per chunk.
constexpr int kDim = 128;          ///< dk = dv.
constexpr int kRow = kDim + 8;     ///< Shared row of a [64, 128] tile, in bf16.
constexpr int kSquareRow = kChunk + 8; ///< Shared row of a [64, 64] tile, in bf16.
constexpr int kStateColumns = 32;  ///< Value columns per recurrence block.
constexpr int kStateRow = kStateColumns + 8;

/// Two floats as a bf16 pair (lower index in the low half).
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&p);
}

/// B fragments of n-tiles n0 and n0 + 8 for k rows [k0, k0 + 16) of a
/// row-major [k][n] bf16 tile: b[0], b[1] for n0; b[2], b[3] for n0 + 8.
__device__ __forceinline__ void loadFragmentsB(uint32_t (&b)[4], const bf16 *tile, int stride, int k0, int n0,
                                               int lane) {
  const int matrix = lane / 8;
  ldmatrixX4Trans(b, tile + (k0 + (matrix % 2) * 8 + lane % 8) * stride + n0 + (matrix / 2) * 8);
}

/// The A fragment of M = rows [m0, m0 + 16), K = [k0, k0 + 16) of the
/// transpose of a row-major [k][m] bf16 tile.
__device__ __forceinline__ void loadFragmentATransposed(uint32_t (&a)[4], const bf16 *tile, int stride, int k0,
                                                        int m0, int lane) {
  const int matrix = lane / 8;
  ldmatrixX4Trans(a, tile + (k0 + (matrix / 2) * 8 + lane % 8) * stride + m0 + (matrix % 2) * 8);
}

/// The [128, 32] slice of a state (or its gradient) that a recurrence block
/// keeps in mma accumulators: warp w holds rows [32 w, 32 w + 32) as two
/// m-tiles of four n-tiles.
using StateSlice = float[2][4][4];

/// Calls f(mt, nt, i, row, column) for each of the warp's StateSlice
/// elements (row in [0, 128), column in [0, 32)).
template <typename F> __device__ __forceinline__ void forStateSlice(int warp, int g, int t, F f) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        f(mt, nt, i, 32 * warp + 16 * mt + g + (i / 2) * 8, 8 * nt + 2 * t + i % 2);
}

/// acc = rows [16 warp, 16 warp + 16) of the [64][kRow] tile \p rows times
/// the [128][kStateRow] tile \p state: a warp's share of a chunk's [64, 32]
/// product with the state slice.
__device__ __forceinline__ void chunkRowsTimesState(float (&acc)[4][4], const bf16 *rows, const bf16 *state, int warp,
                                                    int g, int t, int lane) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[nt][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    uint32_t fa[4];
    loadFragmentA(fa, rows + 16 * warp * kRow, kRow, kk, g, t);
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t fb[4];
      loadFragmentsB(fb, state, kStateRow, 16 * kk, 16 * np, lane);
      mma16816(acc[2 * np], fa, fb[0], fb[1]);
      mma16816(acc[2 * np + 1], fa, fb[2], fb[3]);
    }
  }
}

/// Allows \p kernel \p bytes of dynamic shared memory (above 48 KiB).
template <typename Kernel> void allowSharedMemory(Kernel kernel, size_t bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

} // namespace adapt::rt::cuda::delta

#endif // ADAPT_RUNTIME_CUDA_DELTARULE_CUH
