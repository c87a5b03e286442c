//===- GroupKernel.cu - token-expert pairs grouped by expert, stably ------===//

#include "runtime/cuda/GroupKernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kChunk = 256;        ///< Pairs per chunk (block) of the count and place kernels.
constexpr int kMaxExperts = 1024;  ///< One thread per expert in the scan block.

/// firsts[c][e] = how many pairs of chunk c go to expert e.
__global__ void countKernel(const int64_t *__restrict__ experts, int32_t *__restrict__ firsts, int64_t pairs,
                            int count) {
  __shared__ int hist[kMaxExperts];
  for (int e = threadIdx.x; e < count; e += blockDim.x)
    hist[e] = 0;
  __syncthreads();
  const int64_t p = int64_t(blockIdx.x) * kChunk + threadIdx.x;
  if (threadIdx.x < kChunk && p < pairs)
    atomicAdd(&hist[experts[p]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < count; e += blockDim.x)
    firsts[int64_t(blockIdx.x) * count + e] = hist[e];
}

/// One block, thread e per expert: the counts, padded row counts and ends,
/// each chunk's first row of expert e (in place of its count), and the
/// padding rows (token 0, weight 0, their expert).
__global__ void scanKernel(int32_t *__restrict__ firsts, int64_t chunks, int count, int64_t align, int64_t bound,
                           int64_t *__restrict__ counts, int64_t *__restrict__ rowCounts,
                           int32_t *__restrict__ offsets, int64_t *__restrict__ tokenOfRow,
                           float *__restrict__ weightOfRow, int64_t *__restrict__ expertOfRow) {
  __shared__ int64_t scan[kMaxExperts];
  const int e = threadIdx.x;
  int64_t total = 0;
  if (e < count)
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t n = firsts[c * count + e];
      firsts[c * count + e] = static_cast<int32_t>(total);
      total += n;
    }
  const int64_t padded = align > 1 ? (total + align - 1) / align * align : total;
  scan[e] = e < count ? padded : 0;
  __syncthreads();
  for (int step = 1; step < kMaxExperts; step *= 2) { // inclusive scan of the padded counts
    const int64_t add = e >= step ? scan[e - step] : 0;
    __syncthreads();
    scan[e] += add;
    __syncthreads();
  }
  const int64_t start = scan[e] - padded;
  const int64_t end = e == count - 1 ? bound : scan[e]; // the last group runs to the bound
  if (e < count) {
    counts[e] = total;
    rowCounts[e] = end - start;
    offsets[e] = static_cast<int32_t>(end);
    for (int64_t c = 0; c < chunks; ++c)
      firsts[c * count + e] += static_cast<int32_t>(start);
    if (e != count - 1)
      for (int64_t r = start + total; r < end; ++r)
        tokenOfRow[r] = 0, weightOfRow[r] = 0.0f, expertOfRow[r] = e;
  }
  // The last group's padding (up to E * (align - 1) rows), by every thread.
  __shared__ int64_t lastFirstPad;
  if (e == count - 1)
    lastFirstPad = start + total;
  __syncthreads();
  for (int64_t r = lastFirstPad + e; r < bound; r += blockDim.x)
    tokenOfRow[r] = 0, weightOfRow[r] = 0.0f, expertOfRow[r] = count - 1;
}

/// One warp per chunk places its pairs in order: a pair's row is its
/// expert's next row in this chunk (its rank among equal experts in the
/// warp's 32 pairs, after the earlier rounds').
__global__ void placeKernel(const int64_t *__restrict__ experts, const float *__restrict__ weights,
                            const int32_t *__restrict__ firsts, int64_t pairs, int count, int64_t perToken,
                            int64_t *__restrict__ rowOfPair, int64_t *__restrict__ tokenOfRow,
                            float *__restrict__ weightOfRow, int64_t *__restrict__ expertOfRow) {
  __shared__ int32_t next[kMaxExperts];
  const int64_t chunk = blockIdx.x;
  for (int e = threadIdx.x; e < count; e += blockDim.x)
    next[e] = firsts[chunk * count + e];
  __syncwarp();
  const int lane = threadIdx.x;
  for (int round = 0; round < kChunk / 32; ++round) {
    const int64_t p = chunk * kChunk + round * 32 + lane;
    const bool live = p < pairs;
    const int e = live ? static_cast<int>(experts[p]) : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (live) {
      const int64_t row = next[e] + rank;
      rowOfPair[p] = row;
      tokenOfRow[row] = p / perToken;
      weightOfRow[row] = weights[p];
      expertOfRow[row] = e;
    }
    __syncwarp();
    if (live && rank == 0)
      next[e] += __popc(same);
    __syncwarp();
  }
}

} // namespace

bool groupKernelFits(const at::Tensor &experts, int64_t count) {
  return experts.is_cuda() && experts.scalar_type() == at::kLong && experts.dim() == 2 && experts.numel() > 0 &&
         count >= 1 && count <= kMaxExperts;
}

GroupedPairs groupPairs(const at::Tensor &experts, const at::Tensor &weights, int64_t count, int64_t align) {
  const c10::cuda::CUDAGuard guard(experts.device());
  const at::Tensor flat = experts.contiguous().view({-1}), w = weights.to(at::kFloat).contiguous().view({-1});
  const int64_t pairs = flat.size(0), perToken = experts.size(1);
  const int64_t chunks = (pairs + kChunk - 1) / kChunk;
  const int64_t bound = align > 1 ? pairs + count * (align - 1) : pairs;
  const auto longs = flat.options();
  GroupedPairs g;
  g.counts = at::empty({count}, longs);
  g.rowCounts = at::empty({count}, longs);
  g.offsets = at::empty({count}, longs.dtype(at::kInt));
  g.rowOfPair = at::empty({pairs}, longs);
  g.tokenOfRow = at::empty({bound}, longs);
  g.weightOfRow = at::empty({bound}, longs.dtype(at::kFloat));
  g.expertOfRow = at::empty({bound}, longs);
  at::Tensor firsts = at::empty({chunks, count}, longs.dtype(at::kInt));
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int c = static_cast<int>(count);
  countKernel<<<static_cast<unsigned>(chunks), kChunk, 0, stream>>>(flat.data_ptr<int64_t>(),
                                                                     firsts.data_ptr<int32_t>(), pairs, c);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  scanKernel<<<1, kMaxExperts, 0, stream>>>(firsts.data_ptr<int32_t>(), chunks, c, align, bound,
                                            g.counts.data_ptr<int64_t>(), g.rowCounts.data_ptr<int64_t>(),
                                            g.offsets.data_ptr<int32_t>(), g.tokenOfRow.data_ptr<int64_t>(),
                                            g.weightOfRow.data_ptr<float>(), g.expertOfRow.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  placeKernel<<<static_cast<unsigned>(chunks), 32, 0, stream>>>(
      flat.data_ptr<int64_t>(), w.data_ptr<float>(), firsts.data_ptr<int32_t>(), pairs, c, perToken,
      g.rowOfPair.data_ptr<int64_t>(), g.tokenOfRow.data_ptr<int64_t>(), g.weightOfRow.data_ptr<float>(),
      g.expertOfRow.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return g;
}

} // namespace adapt::rt::cuda
