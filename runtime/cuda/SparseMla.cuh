//===- SparseMla.cuh - what sparse MLA's forward and backward kernels share ===//
//
// The latents' widths, the shared-memory row padding, the gather of selected
// rows and the logit's rounding: the backward recomputes the forward's
// logits, so both must gather and round the same way.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_SPARSEMLA_CUH
#define ADAPT_RUNTIME_CUDA_SPARSEMLA_CUH

#include <cuda_bf16.h>

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

} // namespace adapt::rt::cuda::sparse_mla

#endif // ADAPT_RUNTIME_CUDA_SPARSEMLA_CUH
