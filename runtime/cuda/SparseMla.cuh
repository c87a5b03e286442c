//===- SparseMla.cuh - what sparse MLA's forward and backward kernels share ===//
//
// The latents' widths, the shared-memory row padding, the gather of selected
// rows and the logit's rounding: the backward recomputes the forward's
// logits, so both must gather and round the same way.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_SPARSEMLA_CUH
#define ADAPT_RUNTIME_CUDA_SPARSEMLA_CUH

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>

#include "runtime/cuda/Mma.cuh"

#include <cstdint>

namespace adapt::rt::cuda::sparse_mla {

constexpr int kWarps = 4;
constexpr int kHeads = 16;        ///< Heads per block: one m-tile.
constexpr int kKeyDim = 576;      ///< The latents' width (512 + 64 rotary).
constexpr int kValueDim = 512;    ///< Values: the latents' first 512 columns.
constexpr int kRow = kKeyDim + 8; ///< Padded row: 292 words, so rows g = 0..7 hit distinct banks.
constexpr int kVectors = kKeyDim / 8; ///< 16-byte vectors per latent row.

/// The logit as the composition rounds it: bf16 product, then bf16 scaled.
__device__ __forceinline__ float roundedLogit(float dot, float scale) {
  return __bfloat162float(__float2bfloat16_rn(__bfloat162float(__float2bfloat16_rn(dot)) * scale));
}

/// The latent row of batch \p batch that slot index \p index names (clamped
/// to the last key, as the composition's gather).
__device__ __forceinline__ int64_t latentRow(int64_t batch, int64_t keyLen, int64_t index) {
  return batch * keyLen + min(index, keyLen - 1);
}

/// Copies \p rows rows of kKeyDim bf16 (row \p source(r), or zeros where it
/// is negative) into \p tile (kRow per row), all threads of the block.
template <typename Source>
__device__ __forceinline__ void gatherRows(__nv_bfloat16 *tile, const __nv_bfloat16 *latents, int rows,
                                           Source source) {
  for (int v = threadIdx.x; v < rows * kVectors; v += blockDim.x) {
    const int r = v / kVectors, col = (v % kVectors) * 8;
    const int64_t row = source(r);
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (row >= 0)
      value = *reinterpret_cast<const uint4 *>(latents + row * kKeyDim + col);
    *reinterpret_cast<uint4 *>(tile + r * kRow + col) = value;
  }
}

/// acc [16 x 8 Tiles] += A [16 x Slots] . rows [Slots x 8 Tiles]: A row-major
/// in shared memory (\p aStride per row), rows the gathered latents (kRow per
/// row) from column \p firstColumn, their fragments read transposed. P V in
/// the forward, dS K in the backward.
template <int Slots, int Tiles>
__device__ __forceinline__ void addProductWithRows(float (&acc)[Tiles][4], const __nv_bfloat16 *a, int aStride,
                                                   const __nv_bfloat16 *rowTile, int firstColumn) {
  static_assert(Slots % 16 == 0 && Tiles % 2 == 0, "whole k-steps and pairs of n-tiles");
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, matrix = lane / 8, matrixRow = lane % 8;
#pragma unroll
  for (int kk = 0; kk < Slots / 16; ++kk) {
    uint32_t fragment[4];
    loadFragmentA(fragment, a, aStride, kk, g, t);
    const __nv_bfloat16 *rows =
        rowTile + (kk * 16 + (matrix % 2) * 8 + matrixRow) * kRow + firstColumn + (matrix / 2) * 8;
#pragma unroll
    for (int np = 0; np < Tiles / 2; ++np) {
      uint32_t b[4];
      ldmatrixX4Trans(b, rows + np * 16);
      mma16816(acc[2 * np], fragment, b[0], b[1]);
      mma16816(acc[2 * np + 1], fragment, b[2], b[3]);
    }
  }
}

/// The host-side checks both launchers make of the selection: int64
/// \p indices and bool \p valid [B, T, k] for q [B, T, H, D], and a grid
/// of B x H / kHeads blocks that CUDA can launch. \p op names the caller.
inline void checkSelection(const at::Tensor &q, const at::Tensor &indices, const at::Tensor &valid, const char *op) {
  TORCH_CHECK(indices.dim() == 3 && indices.size(0) == q.size(0) && indices.size(1) == q.size(1) &&
                  indices.scalar_type() == at::kLong && valid.sizes() == indices.sizes() &&
                  valid.scalar_type() == at::kBool,
              op, ": expected int64 indices and bool valid [B, T, k]");
  TORCH_CHECK(q.size(0) <= 65535 && q.size(2) / kHeads <= 65535, op, ": grid too large");
}

/// Lets \p kernel use \p bytes of dynamic shared memory (above the 48 KB
/// default). Callers do it once per kernel, on its first (eager) launch:
/// not while a CUDA graph is being captured.
template <typename Kernel>
void allowSharedBytes(Kernel kernel, size_t bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

} // namespace adapt::rt::cuda::sparse_mla

#endif // ADAPT_RUNTIME_CUDA_SPARSEMLA_CUH
