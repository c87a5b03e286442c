//===- FusedIndexerKernel.cu - the lightning indexer in one kernel --------===//
//
// mma.sync m16n8k16 (bf16 in, fp32 accumulation). The A operand is one
// query's [heads, dim] (heads are the 16 rows of an m-tile), B is 8 keys of
// the shared-memory tile. Per m16n8 accumulator a thread holds rows g and
// g + 8 (two heads) for keys 2t and 2t + 1 (g = lane / 4, t = lane % 4), so
// relu and the head weights apply in registers, each thread sums its heads,
// and three shuffles over g sum all heads of the query for its two keys.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/FusedIndexerKernel.h"
#include "runtime/cuda/Mma.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace adapt::rt::cuda {

namespace {

constexpr int kWarps = 4;          ///< Queries per block, one warp each.
constexpr int kKeyTile = 64;       ///< Keys per shared-memory tile (8 n-tiles).
constexpr int kTilesPerBlock = 8;  ///< Tiles one block walks: 512 keys.
constexpr int kRowPad = 8;         ///< bf16 after each key row: lanes g = 0..7 hit distinct banks.

/// Scores of queries [blockIdx.y * kWarps, +kWarps) against keys
/// [blockIdx.x * kTilesPerBlock * kKeyTile, +kTilesPerBlock * kKeyTile).
/// MT m-tiles of 16 heads, KS k-steps of 16 dims.
template <int MT, int KS>
__global__ void __launch_bounds__(kWarps * 32)
    fusedIndexerKernel(const __nv_bfloat16 *__restrict__ q, int64_t queryStride, int64_t headStride,
                       const __nv_bfloat16 *__restrict__ k, const float *__restrict__ weights,
                       float *__restrict__ out, int64_t queries, int64_t keys, int64_t firstPosition) {
  constexpr int kDim = KS * 16, kHeads = MT * 16, kRow = kDim + kRowPad, kVectorsPerRow = kDim / 8;
  __shared__ __align__(16) __nv_bfloat16 tile[kKeyTile * kRow];
  __shared__ float staged[kWarps][kKeyTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t firstQuery = int64_t(blockIdx.y) * kWarps, query = firstQuery + warp;
  const bool active = query < queries;
  const int64_t position = firstPosition + query; // Keys after it are masked.
  const int64_t blockLastPosition = firstPosition + min(firstQuery + kWarps, queries) - 1;

  // The query's heads as A fragments (rows g and g + 8 of each m-tile), and
  // the weights of the two heads this thread's accumulator rows are.
  uint32_t a[MT][KS][4];
  float weightLow[MT], weightHigh[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t head = mt * 16 + g;
    const __nv_bfloat16 *low = q + (active ? query : 0) * queryStride + head * headStride + 2 * t;
    const __nv_bfloat16 *high = low + 8 * headStride;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      a[mt][ks][0] = active ? bf16Pair(low + ks * 16) : 0u;
      a[mt][ks][1] = active ? bf16Pair(high + ks * 16) : 0u;
      a[mt][ks][2] = active ? bf16Pair(low + ks * 16 + 8) : 0u;
      a[mt][ks][3] = active ? bf16Pair(high + ks * 16 + 8) : 0u;
    }
    weightLow[mt] = active ? weights[query * kHeads + head] : 0.0f;
    weightHigh[mt] = active ? weights[query * kHeads + head + 8] : 0.0f;
  }

  const float negInf = negativeInfinity();
  for (int tileIndex = 0; tileIndex < kTilesPerBlock; ++tileIndex) {
    const int64_t firstKey = (int64_t(blockIdx.x) * kTilesPerBlock + tileIndex) * kKeyTile;
    if (firstKey >= keys) // The same for the whole block.
      break;
    if (firstKey <= blockLastPosition) { // Some query of the block sees this tile.
      __syncthreads();                   // The previous tile's readers are done.
      for (int v = threadIdx.x; v < kKeyTile * kVectorsPerRow; v += blockDim.x) {
        const int row = v / kVectorsPerRow, col = (v % kVectorsPerRow) * 8;
        uint4 value = make_uint4(0u, 0u, 0u, 0u);
        if (firstKey + row < keys)
          value = *reinterpret_cast<const uint4 *>(k + (firstKey + row) * kDim + col);
        *reinterpret_cast<uint4 *>(tile + row * kRow + col) = value;
      }
      __syncthreads();
      if (active && firstKey <= position) {
#pragma unroll 1
        for (int nt = 0; nt < kKeyTile / 8; ++nt) {
          float acc[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
          const __nv_bfloat16 *b = tile + (nt * 8 + g) * kRow + 2 * t;
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            const uint32_t b0 = bf16Pair(b + ks * 16), b1 = bf16Pair(b + ks * 16 + 8);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              mma16816(acc[mt], a[mt][ks], b0, b1);
          }
          float key0 = 0.0f, key1 = 0.0f; // Keys nt * 8 + 2t and + 1, this thread's heads.
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            key0 += weightLow[mt] * fmaxf(acc[mt][0], 0.0f) + weightHigh[mt] * fmaxf(acc[mt][2], 0.0f);
            key1 += weightLow[mt] * fmaxf(acc[mt][1], 0.0f) + weightHigh[mt] * fmaxf(acc[mt][3], 0.0f);
          }
#pragma unroll
          for (int offset = 4; offset < 32; offset *= 2) { // Sum over g: every head.
            key0 += __shfl_xor_sync(0xffffffffu, key0, offset);
            key1 += __shfl_xor_sync(0xffffffffu, key1, offset);
          }
          if (g == 0) {
            staged[warp][nt * 8 + 2 * t] = key0;
            staged[warp][nt * 8 + 2 * t + 1] = key1;
          }
        }
        __syncwarp();
      }
    }
    if (active) // Coalesced: the warp writes its query's 64 scores of the tile.
      for (int j = lane; j < kKeyTile; j += 32) {
        const int64_t key = firstKey + j;
        if (key < keys)
          out[query * keys + key] = key <= position ? staged[warp][j] : negInf;
      }
    __syncwarp(); // Read before the next tile's scores are staged.
  }
}

template <int MT, int KS>
void launch(const at::Tensor &q, const at::Tensor &k, const at::Tensor &weights, at::Tensor &out,
            int64_t firstPosition) {
  const int64_t queries = q.size(0), keys = k.size(0);
  const dim3 grid(static_cast<unsigned>((keys + kTilesPerBlock * kKeyTile - 1) / (kTilesPerBlock * kKeyTile)),
                  static_cast<unsigned>((queries + kWarps - 1) / kWarps));
  fusedIndexerKernel<MT, KS><<<grid, kWarps * 32, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16 *>(q.data_ptr<at::BFloat16>()), q.stride(0), q.stride(1),
      reinterpret_cast<const __nv_bfloat16 *>(k.data_ptr<at::BFloat16>()), weights.data_ptr<float>(),
      out.data_ptr<float>(), queries, keys, firstPosition);
}

template <int MT>
void launchForDim(const at::Tensor &q, const at::Tensor &k, const at::Tensor &weights, at::Tensor &out,
                  int64_t firstPosition) {
  switch (q.size(2)) {
  case 32:
    return launch<MT, 2>(q, k, weights, out, firstPosition);
  case 64:
    return launch<MT, 4>(q, k, weights, out, firstPosition);
  default:
    return launch<MT, 8>(q, k, weights, out, firstPosition);
  }
}

} // namespace

bool fusedIndexerTakes(const at::Tensor &q, const at::Tensor &k) {
  if (!q.is_cuda() || !k.is_cuda() || q.scalar_type() != at::kBFloat16 || k.scalar_type() != at::kBFloat16 ||
      q.dim() != 3 || k.dim() != 2)
    return false;
  const int64_t heads = q.size(1), dim = q.size(2);
  if ((heads != 16 && heads != 32 && heads != 64) || (dim != 32 && dim != 64 && dim != 128) || k.size(1) != dim)
    return false;
  // 32-bit loads of q's element pairs, 16-byte loads of k's rows.
  return q.stride(2) == 1 && q.stride(0) % 2 == 0 && q.stride(1) % 2 == 0 &&
         reinterpret_cast<std::uintptr_t>(q.data_ptr()) % 4 == 0 && k.stride(1) == 1 && k.stride(0) == dim &&
         reinterpret_cast<std::uintptr_t>(k.data_ptr()) % 16 == 0;
}

at::Tensor fusedIndexerScores(const at::Tensor &q, const at::Tensor &k, const at::Tensor &weights,
                              int64_t firstPosition) {
  TORCH_CHECK(fusedIndexerTakes(q, k), "fusedIndexerScores: q [n, H, D] and k [S, D] not of a layout it takes");
  TORCH_CHECK(weights.dim() == 2 && weights.is_contiguous() && weights.scalar_type() == at::kFloat &&
                  weights.size(0) == q.size(0) && weights.size(1) == q.size(1),
              "fusedIndexerScores: expected fp32 weights [n, H]");
  TORCH_CHECK(q.size(0) <= int64_t(65535) * kWarps, "fusedIndexerScores: too many queries per call");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({q.size(0), k.size(0)}, q.options().dtype(at::kFloat));
  if (out.numel() == 0)
    return out;
  switch (q.size(1)) {
  case 16:
    launchForDim<1>(q, k, weights, out, firstPosition);
    break;
  case 32:
    launchForDim<2>(q, k, weights, out, firstPosition);
    break;
  default:
    launchForDim<4>(q, k, weights, out, firstPosition);
    break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

} // namespace adapt::rt::cuda
