//===- ExpertCombineKernel.cu - experts' rows back to tokens --------------===//
//
// Forward: one block per token reads its k rows and writes the weighted sum
// (the composition materialises the gathered [T*k, H] rows and runs a
// batched GEMM of k-long dot products, a shape cuBLAS handles badly).
// Backward: one pass over the expert rows, each written once (the pair that
// owns it, or zero), and one warp per pair for the weight's dot product.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/ExpertCombineKernel.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = 64;

template <typename T>
__global__ void combineKernel(const T *__restrict__ rows, const int64_t *__restrict__ rowOfPair,
                              const float *__restrict__ weights, T *__restrict__ y, int64_t hidden, int k) {
  __shared__ int64_t src[kMaxK];
  __shared__ float w[kMaxK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < k) {
    src[threadIdx.x] = rowOfPair[t * k + threadIdx.x];
    w[threadIdx.x] = weights ? weights[t * k + threadIdx.x] : 1.0f;
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      acc += w[j] * static_cast<float>(rows[src[j] * hidden + h]);
    y[t * hidden + h] = static_cast<T>(acc);
  }
}

template <typename T>
__global__ void gradRowsKernel(const T *__restrict__ gradY, const int64_t *__restrict__ pairOfRow,
                               const float *__restrict__ weights, T *__restrict__ gradRows, int64_t hidden, int k) {
  const int64_t r = blockIdx.x, p = pairOfRow[r];
  const float w = p < 0 ? 0.0f : (weights ? weights[p] : 1.0f);
  const T *g = p < 0 ? nullptr : gradY + (p / k) * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
    gradRows[r * hidden + h] = static_cast<T>(g ? w * static_cast<float>(g[h]) : 0.0f);
}

template <typename T>
__global__ void gradWeightsKernel(const T *__restrict__ gradY, const T *__restrict__ rows,
                                  const int64_t *__restrict__ rowOfPair, float *__restrict__ gradW, int64_t pairs,
                                  int64_t hidden, int k) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= pairs)
    return;
  const T *g = gradY + (warp / k) * hidden, *x = rows + rowOfPair[warp] * hidden;
  float acc = 0.0f;
  for (int64_t h = lane; h < hidden; h += 32)
    acc += static_cast<float>(g[h]) * static_cast<float>(x[h]);
  for (int offset = 16; offset > 0; offset /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0)
    gradW[warp] = acc;
}

at::Tensor weightsAsFloat(const at::Tensor &weights) {
  return weights.defined() ? weights.to(at::kFloat).contiguous() : at::Tensor();
}

} // namespace

at::Tensor combineRows(const at::Tensor &rows, const at::Tensor &rowOfPair, const at::Tensor &weights, int64_t k) {
  TORCH_CHECK(k > 0 && k <= kMaxK, "combineRows: k must be in [1, ", kMaxK, "]");
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t tokens = rowOfPair.size(0) / k, hidden = rows.size(1);
  at::Tensor y = at::empty({tokens, hidden}, rows.options());
  if (y.numel() == 0)
    return y;
  const at::Tensor w = weightsAsFloat(weights), in = rows.contiguous(), pairs = rowOfPair.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, rows.scalar_type(), "combineRows", [&] {
    combineKernel<scalar_t><<<tokens, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.data_ptr<scalar_t>(), pairs.data_ptr<int64_t>(), w.defined() ? w.data_ptr<float>() : nullptr,
        y.data_ptr<scalar_t>(), hidden, static_cast<int>(k));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

at::Tensor combineRowsGradRows(const at::Tensor &gradY, const at::Tensor &rowOfPair, const at::Tensor &weights,
                               int64_t k, int64_t rows) {
  const c10::cuda::CUDAGuard guard(gradY.device());
  const int64_t hidden = gradY.size(1);
  at::Tensor grad = at::empty({rows, hidden}, gradY.options());
  if (grad.numel() == 0)
    return grad;
  // Which pair owns each row (-1: padding), so every row is written once.
  at::Tensor pairOfRow = at::full({rows}, -1, rowOfPair.options())
                             .index_copy_(0, rowOfPair, at::arange(rowOfPair.size(0), rowOfPair.options()));
  const at::Tensor w = weightsAsFloat(weights), g = gradY.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gradY.scalar_type(), "combineRowsGradRows", [&] {
    gradRowsKernel<scalar_t><<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        g.data_ptr<scalar_t>(), pairOfRow.data_ptr<int64_t>(), w.defined() ? w.data_ptr<float>() : nullptr,
        grad.data_ptr<scalar_t>(), hidden, static_cast<int>(k));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

at::Tensor combineRowsGradWeights(const at::Tensor &gradY, const at::Tensor &rows, const at::Tensor &rowOfPair,
                                  int64_t k, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(gradY.device());
  const int64_t pairs = rowOfPair.size(0), hidden = gradY.size(1);
  at::Tensor gradW = at::empty({pairs / k, k}, gradY.options().dtype(at::kFloat));
  if (pairs == 0)
    return gradW.to(dtype);
  const at::Tensor g = gradY.contiguous(), in = rows.contiguous(), owner = rowOfPair.contiguous();
  const int64_t blocks = (pairs * 32 + kThreads - 1) / kThreads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gradY.scalar_type(), "combineRowsGradWeights", [&] {
    gradWeightsKernel<scalar_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        g.data_ptr<scalar_t>(), in.data_ptr<scalar_t>(), owner.data_ptr<int64_t>(), gradW.data_ptr<float>(), pairs,
        hidden, static_cast<int>(k));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return gradW.to(dtype);
}

} // namespace adapt::rt::cuda
