//===- IndexerKernel.cu - the lightning indexer's head reduction ----------===//
//
// One thread per two adjacent keys of one query: a loop over the heads reads
// both keys' scores as one vector per head (coalesced across the warp), the
// head weights sit in shared memory, and the pair of fp32 results is written
// once. Keys past the query's position get -inf, as the composition's mask.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/IndexerKernel.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <limits>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeads = 256;

template <typename T>
__global__ void indexerScoresKernel(const T *__restrict__ scores, const float *__restrict__ weights,
                                    float *__restrict__ out, int heads, int64_t keys, int64_t firstPosition) {
  __shared__ float w[kMaxHeads];
  const int64_t query = blockIdx.y;
  for (int h = threadIdx.x; h < heads; h += blockDim.x)
    w[h] = weights[query * heads + h];
  __syncthreads();
  const int64_t key = 2 * (int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (key >= keys)
    return;
  const bool pair = key + 1 < keys;
  const T *row = scores + query * heads * keys + key;
  float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 8
  for (int h = 0; h < heads; ++h) {
    const T *s = row + int64_t(h) * keys;
    acc0 += w[h] * fmaxf(static_cast<float>(s[0]), 0.0f);
    if (pair)
      acc1 += w[h] * fmaxf(static_cast<float>(s[1]), 0.0f);
  }
  const int64_t last = firstPosition + query; // the query's own position
  const float negInf = -std::numeric_limits<float>::infinity();
  float *o = out + query * keys + key;
  o[0] = key <= last ? acc0 : negInf;
  if (pair)
    o[1] = key + 1 <= last ? acc1 : negInf;
}

} // namespace

at::Tensor indexerScores(const at::Tensor &headScores, const at::Tensor &weights, int64_t firstPosition) {
  TORCH_CHECK(headScores.dim() == 3 && headScores.is_contiguous(), "indexerScores: expected contiguous [n, H, S]");
  TORCH_CHECK(weights.dim() == 2 && weights.is_contiguous() && weights.scalar_type() == at::kFloat &&
                  weights.size(0) == headScores.size(0) && weights.size(1) == headScores.size(1),
              "indexerScores: expected fp32 weights [n, H]");
  TORCH_CHECK(headScores.size(1) <= kMaxHeads, "indexerScores: at most ", kMaxHeads, " heads");
  const c10::cuda::CUDAGuard guard(headScores.device());
  const int64_t queries = headScores.size(0), heads = headScores.size(1), keys = headScores.size(2);
  at::Tensor out = at::empty({queries, keys}, headScores.options().dtype(at::kFloat));
  if (out.numel() == 0)
    return out;
  TORCH_CHECK(queries <= 65535, "indexerScores: at most 65,535 queries per call");
  const dim3 grid(static_cast<unsigned>(((keys + 1) / 2 + kThreads - 1) / kThreads), static_cast<unsigned>(queries));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, headScores.scalar_type(), "indexerScores", [&] {
    indexerScoresKernel<scalar_t><<<grid, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        headScores.data_ptr<scalar_t>(), weights.data_ptr<float>(), out.data_ptr<float>(), static_cast<int>(heads),
        keys, firstPosition);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

} // namespace adapt::rt::cuda
