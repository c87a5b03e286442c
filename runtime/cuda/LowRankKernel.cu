//===- LowRankKernel.cu - add a per-expert rank-r product in place --------===//
//
// One thread per two adjacent output columns and a tile of kTileRows rows:
// the tile's rank-r inputs sit in shared memory, the thread keeps its two
// columns of the current expert's factor in registers (reloaded only where
// the expert changes: the GPU's groups are 16-row aligned and usually much
// longer), and every output element is read and written once. The factor's
// 2 x r values of a thread's column pair are contiguous and move in 16-byte
// packs: read one element at a time they cost four times the sector requests
// of the output itself.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/LowRankKernel.h"
#include "runtime/cuda/Packed.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

namespace adapt::rt::cuda {

namespace {

/// Threads per block, or half that where a block of 256 would leave half its
/// threads past the last column pair (the 768-wide gradient of Qwen3-30B-A3B).
constexpr int kThreads = 256;
/// Rows per block: the factor's columns, held in registers, serve all of
/// them (they are reloaded only where the expert changes), so the factor's
/// traffic is a quarter of what it was with 16-row blocks (the second
/// version read as many factor bytes as output bytes). 128-row blocks
/// (session 45: the two dependent start-up loads serving eight output
/// batches instead of four) measured the same on an H100 in session 46,
/// 137.2 against 137.0 us a step at one Qwen3-30B-A3B layer and -0.3 % at
/// 12 layers, and were removed.
constexpr int kTileRows = 64;
/// Rows whose outputs are loaded together, before any is used: enough loads
/// in flight to keep the memory busy (one at a time left it at a quarter of
/// its bandwidth).
constexpr int kBatchRows = 16;

/// Two adjacent elements, moved as one 2-element vector.
template <typename T> struct alignas(2 * sizeof(T)) Pair {
  T first, second;
};

/// Loads column col's and col + 1's r values of expert \p e's factor into
/// registers, in 16-byte packs.
template <typename T, int Rank>
__device__ __forceinline__ void loadColumns(const T *__restrict__ factor, int64_t e, int64_t width, int64_t col,
                                            float (&column0)[Rank], float (&column1)[Rank]) {
  const T *f = factor + (e * width + col) * Rank; // column col's r values, then col + 1's
  using P = Pack<T>;
#pragma unroll
  for (int k = 0; k < Rank; k += P::kSize) {
    const P first = P::load(f + k), second = P::load(f + Rank + k);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i) {
      column0[k + i] = first.v[i];
      column1[k + i] = second.v[i];
    }
  }
}

/// Loads rows [batch, batch + kBatchRows) of the tile (those below
/// \p tileRows) at the thread's column pair.
template <typename T>
__device__ __forceinline__ void loadBatch(const T *__restrict__ out, int64_t firstRow, int batch, int tileRows,
                                          int64_t outStride, int64_t col, Pair<T> (&values)[kBatchRows]) {
#pragma unroll
  for (int i = 0; i < kBatchRows; ++i)
    if (batch + i < tileRows)
      values[i] = *reinterpret_cast<const Pair<T> *>(out + (firstRow + batch + i) * outStride + col);
}

/// The tile's rows, kBatchRows at a time: each 64-row block waits through
/// three dependent loads in turn (the tile, the factor, the outputs), which
/// left the kernel at ~2.2x its traffic on an H100 (session 39's profile).
/// Issuing the first outputs and factor columns before the barrier and each
/// next batch during the current one (session 43) was slower on an H100:
/// 206 against 136 us a step at one Qwen3-30B-A3B layer (session 44), the
/// doubled registers costing more occupancy than the overlap gained. A
/// tensor-core form (one m16n8k16 mma per 16 x 8 tile, 64 registers, the
/// outputs read and written in the mma fragments' layout; session 44, commit
/// 607ef44) passed the `expert` checks and memcheck but took 181 against
/// 135 us: its 4-byte accesses cover 8 rows x 16 bytes per warp instruction
/// where this form's cover one row's 128 contiguous bytes, so the kernel is
/// bound by its access pattern, not by its FMAs. Nor by its shared loads: the
/// PTX reads the tile one float at a time (256 loads for 512 FMAs at rank
/// 16), and a 16-byte aligned tile that the compiler reads as float4s (64
/// loads; session 55, commit 4b83768) passed the `expert` checks but ran 12
/// layers at 65.18K against 65.25K tokens/s on an H100.
template <typename T, int Rank>
__global__ void addLowRankRowsKernel(T *__restrict__ out, const T *__restrict__ low, const T *__restrict__ factor,
                                     const int64_t *__restrict__ expertOfRow, int64_t rows, int64_t width,
                                     int64_t outStride, int64_t lowStride) {
  __shared__ float lowTile[kTileRows][Rank];
  __shared__ int64_t expertTile[kTileRows];
  const int64_t firstRow = int64_t(blockIdx.x) * kTileRows; // rows on x: no 65,535 limit
  const int tileRows = static_cast<int>(rows - firstRow < kTileRows ? rows - firstRow : kTileRows);
  const int64_t col = 2 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  const bool active = col < width;
  float column0[Rank], column1[Rank];
  int64_t loaded = -1;
  Pair<T> values[kBatchRows];
  for (int i = threadIdx.x; i < tileRows * Rank; i += blockDim.x)
    lowTile[i / Rank][i % Rank] = static_cast<float>(low[(firstRow + i / Rank) * lowStride + i % Rank]);
  for (int i = threadIdx.x; i < tileRows; i += blockDim.x)
    expertTile[i] = expertOfRow[firstRow + i];
  __syncthreads();
  if (!active)
    return;
  for (int batch = 0; batch < tileRows; batch += kBatchRows) {
    loadBatch(out, firstRow, batch, tileRows, outStride, col, values);
#pragma unroll
    for (int i = 0; i < kBatchRows; ++i) {
      const int row = batch + i;
      if (row >= tileRows)
        break;
      const int64_t e = expertTile[row];
      if (e != loaded) {
        loadColumns<T, Rank>(factor, e, width, col, column0, column1);
        loaded = e;
      }
      float acc0 = static_cast<float>(values[i].first), acc1 = static_cast<float>(values[i].second);
#pragma unroll
      for (int k = 0; k < Rank; ++k) {
        acc0 += lowTile[row][k] * column0[k];
        acc1 += lowTile[row][k] * column1[k];
      }
      *reinterpret_cast<Pair<T> *>(out + (firstRow + row) * outStride + col) =
          Pair<T>{static_cast<T>(acc0), static_cast<T>(acc1)};
    }
  }
}

template <typename T, int Rank>
void launch(at::Tensor &out, const at::Tensor &low, const at::Tensor &factor, const at::Tensor &expertOfRow) {
  const int64_t rows = out.size(0), width = out.size(1);
  const int threads = (width / 2) % kThreads == 0 || (width / 2) % (kThreads / 2) != 0 ? kThreads : kThreads / 2;
  const dim3 grid(static_cast<unsigned>((rows + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((width / 2 + threads - 1) / threads));
  addLowRankRowsKernel<T, Rank><<<grid, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      out.data_ptr<T>(), low.data_ptr<T>(), factor.data_ptr<T>(), expertOfRow.data_ptr<int64_t>(), rows, width,
      out.stride(0), low.stride(0));
}

} // namespace

bool lowRankSupported(int64_t rank) { return rank > 0 && rank <= 32 && rank % 8 == 0; }

void addLowRankRows(at::Tensor &out, const at::Tensor &low, const at::Tensor &factor,
                    const at::Tensor &expertOfRow) {
  const int64_t rank = low.size(1);
  TORCH_CHECK(lowRankSupported(rank), "addLowRankRows: rank ", rank, " is not a multiple of 8 up to 32");
  TORCH_CHECK(out.size(1) % 2 == 0, "addLowRankRows: expected an even width, found ", out.size(1));
  // out and low may be column ranges of wider buffers: unit column stride,
  // an even row stride for out (its column pairs move as one 4-byte access).
  TORCH_CHECK(out.dim() == 2 && low.dim() == 2 && out.stride(1) == 1 && out.stride(0) % 2 == 0 &&
                  out.stride(0) >= out.size(1) && low.stride(1) == 1 && low.stride(0) >= rank &&
                  factor.is_contiguous() && expertOfRow.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(factor.data_ptr()) % 16 == 0,
              "addLowRankRows: expected row-major out and low (unit column stride, out's row stride even) and a "
              "contiguous, 16-byte aligned factor");
  TORCH_CHECK(factor.dim() == 3 && factor.size(1) == out.size(1) && factor.size(2) == rank &&
                  low.size(0) == out.size(0) && expertOfRow.size(0) == out.size(0) &&
                  expertOfRow.scalar_type() == at::kLong,
              "addLowRankRows: expected out [R, N], low [R, r], factor [E, N, r], expertOfRow [R] int64");
  if (out.numel() == 0)
    return;
  const c10::cuda::CUDAGuard guard(out.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "addLowRankRows", [&] {
    switch (rank) {
    case 8: launch<scalar_t, 8>(out, low, factor, expertOfRow); break;
    case 16: launch<scalar_t, 16>(out, low, factor, expertOfRow); break;
    case 24: launch<scalar_t, 24>(out, low, factor, expertOfRow); break;
    default: launch<scalar_t, 32>(out, low, factor, expertOfRow); break;
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace adapt::rt::cuda
