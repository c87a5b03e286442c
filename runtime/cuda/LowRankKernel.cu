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
#include "runtime/cuda/Mma.cuh"
#include "runtime/cuda/Packed.cuh"
#include "runtime/cuda/Switches.h"

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
/// version read as many factor bytes as output bytes).
constexpr int kTileRows = 64;
/// Rows whose outputs are loaded together, before any is used: enough loads
/// in flight to keep the memory busy (one at a time left it at a quarter of
/// its bandwidth).
constexpr int kBatchRows = 16;
/// The tensor-core form's block (four warps of 16 rows) and its columns.
constexpr int kMmaThreads = 128;
constexpr int kMmaColumns = 64;

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
/// doubled registers costing more occupancy than the overlap gained.
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

/// The bf16 form on tensor cores (ADAPT_LOW_RANK_MMA=1, written in session
/// 44 without a GPU): the product is one m16n8k16 mma per 16 x 8 tile and
/// 16 ranks, so a warp's 16 rows x 64 columns take 8 (rank 16) or 16 (rank
/// 32) mma instead of 32 FMAs and 16 shared loads per element pair, and about
/// 60 registers instead of ~110-150, so four times the warps per SM keep
/// loads in flight. The accumulators start as the outputs (their fragment
/// layout: rows g and g + 8, columns 2t and 2t + 1 of each 8-column tile), so
/// every output element is read and written once, as by the FMA form. Rows
/// of one 16-row tile usually share an expert (the GPU's groups are 16-row
/// aligned); a tile that mixes experts takes each element by FMAs instead.
template <int Rank>
__global__ void __launch_bounds__(kMmaThreads)
    addLowRankRowsMmaKernel(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ low,
                            const __nv_bfloat16 *__restrict__ factor, const int64_t *__restrict__ expertOfRow,
                            int64_t rows, int64_t width, int64_t outStride, int64_t lowStride) {
  constexpr int kSteps = Rank / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = (int64_t(blockIdx.x) * (kMmaThreads / 32) + warp) * 16;
  if (row0 >= rows)
    return;
  const int64_t col0 = int64_t(blockIdx.y) * kMmaColumns;
  const int64_t rowA = row0 + g, rowB = row0 + g + 8; // this lane's two rows
  const bool hasA = rowA < rows, hasB = rowB < rows;
  const int64_t expertA = expertOfRow[hasA ? rowA : row0], expertB = expertOfRow[hasB ? rowB : row0];
  const int64_t expert = __shfl_sync(0xffffffffu, expertA, 0);
  Pair<__nv_bfloat16> *outA = reinterpret_cast<Pair<__nv_bfloat16> *>(out + rowA * outStride + col0 + 2 * t);
  Pair<__nv_bfloat16> *outB = reinterpret_cast<Pair<__nv_bfloat16> *>(out + rowB * outStride + col0 + 2 * t);
  if (__all_sync(0xffffffffu, expertA == expert && expertB == expert)) {
    uint32_t a[kSteps][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const __nv_bfloat16 *lowA = low + rowA * lowStride + 16 * s + 2 * t, *lowB = low + rowB * lowStride + 16 * s + 2 * t;
      a[s][0] = hasA ? bf16Pair(lowA) : 0u;
      a[s][1] = hasB ? bf16Pair(lowB) : 0u;
      a[s][2] = hasA ? bf16Pair(lowA + 8) : 0u;
      a[s][3] = hasB ? bf16Pair(lowB + 8) : 0u;
    }
    // Every load first (outputs and the factor's B fragments), then the mma.
    float c[kMmaColumns / 8][4];
    uint32_t b[kMmaColumns / 8][kSteps][2];
#pragma unroll
    for (int j = 0; j < kMmaColumns / 8; ++j) {
      const int64_t n = col0 + 8 * j;
      if (n >= width)
        break;
      const __nv_bfloat16 *f = factor + (expert * width + n + g) * Rank + 2 * t; // B[k][n] = factor[e][n][k]
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        b[j][s][0] = bf16Pair(f + 16 * s);
        b[j][s][1] = bf16Pair(f + 16 * s + 8);
      }
      const Pair<__nv_bfloat16> va = hasA ? outA[4 * j] : Pair<__nv_bfloat16>{}, vb = hasB ? outB[4 * j] : Pair<__nv_bfloat16>{};
      c[j][0] = __bfloat162float(va.first), c[j][1] = __bfloat162float(va.second);
      c[j][2] = __bfloat162float(vb.first), c[j][3] = __bfloat162float(vb.second);
    }
#pragma unroll
    for (int j = 0; j < kMmaColumns / 8; ++j) {
      if (col0 + 8 * j >= width)
        break;
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
        mma16816(c[j], a[s], b[j][s][0], b[j][s][1]);
      if (hasA)
        outA[4 * j] = Pair<__nv_bfloat16>{__float2bfloat16(c[j][0]), __float2bfloat16(c[j][1])};
      if (hasB)
        outB[4 * j] = Pair<__nv_bfloat16>{__float2bfloat16(c[j][2]), __float2bfloat16(c[j][3])};
    }
    return;
  }
  // Experts change inside the tile: each of the lane's elements by FMAs.
  for (int j = 0; j < kMmaColumns / 8; ++j) {
    const int64_t n = col0 + 8 * j + 2 * t;
    if (n >= width)
      break;
    for (int half = 0; half < 2; ++half) {
      const int64_t row = half ? rowB : rowA, e = half ? expertB : expertA;
      if (!(half ? hasB : hasA))
        continue;
      Pair<__nv_bfloat16> *o = (half ? outB : outA) + 4 * j;
      const __nv_bfloat16 *l = low + row * lowStride, *f0 = factor + (e * width + n) * Rank, *f1 = f0 + Rank;
      float acc0 = __bfloat162float(o->first), acc1 = __bfloat162float(o->second);
      for (int k = 0; k < Rank; ++k) {
        const float x = __bfloat162float(l[k]);
        acc0 += x * __bfloat162float(f0[k]);
        acc1 += x * __bfloat162float(f1[k]);
      }
      *o = Pair<__nv_bfloat16>{__float2bfloat16(acc0), __float2bfloat16(acc1)};
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

/// Whether \p out, \p low and \p factor suit the tensor-core form: bf16,
/// rank 16 or 32, whole 8-column tiles, 4-byte aligned pairs in low's rows.
bool mmaFits(const at::Tensor &out, const at::Tensor &low, int64_t rank) {
  return out.scalar_type() == at::kBFloat16 && (rank == 16 || rank == 32) && out.size(1) % 8 == 0 &&
         low.stride(0) % 2 == 0 && reinterpret_cast<uintptr_t>(low.data_ptr()) % 4 == 0 &&
         reinterpret_cast<uintptr_t>(out.data_ptr()) % 4 == 0;
}

template <int Rank>
void launchMma(at::Tensor &out, const at::Tensor &low, const at::Tensor &factor, const at::Tensor &expertOfRow) {
  const int64_t rows = out.size(0), width = out.size(1), rowsPerBlock = 16 * (kMmaThreads / 32);
  const dim3 grid(static_cast<unsigned>((rows + rowsPerBlock - 1) / rowsPerBlock),
                  static_cast<unsigned>((width + kMmaColumns - 1) / kMmaColumns));
  auto bf = [](const at::Tensor &x) { return reinterpret_cast<__nv_bfloat16 *>(x.data_ptr<at::BFloat16>()); };
  addLowRankRowsMmaKernel<Rank><<<grid, kMmaThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      bf(out), bf(low), bf(factor), expertOfRow.data_ptr<int64_t>(), rows, width, out.stride(0), low.stride(0));
}

} // namespace

bool lowRankMma() {
  static const bool on = switchedOn("ADAPT_LOW_RANK_MMA");
  return on;
}

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
  if (lowRankMma() && mmaFits(out, low, rank)) {
    rank == 16 ? launchMma<16>(out, low, factor, expertOfRow) : launchMma<32>(out, low, factor, expertOfRow);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
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
