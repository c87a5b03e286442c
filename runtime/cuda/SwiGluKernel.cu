//===- SwiGluKernel.cu - SwiGLU on a fused gate/up projection -------------===//
//
// One elementwise pass each way, over 16-byte packs where the width allows
// (Packed.cuh). The composition (narrow, silu, mul) writes
// silu(gate) as an intermediate, keeps gate, up and silu(gate) for backward,
// and its backward writes each half's gradient into a zero-filled [rows, 2W]
// tensor before adding them; here forward reads gateUp once and backward
// writes the [rows, 2W] gradient once.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/SwiGluKernel.h"
#include "runtime/cuda/Packed.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 256;

/// Row strides (in elements) of the backward's gradients: the output's
/// gradient [rows, W] and the projection's gradient [rows, 2W] may be column
/// ranges of wider buffers (FusedExperts.cpp writes into its own).
struct RowStrides {
  int64_t gradOut, grad;
};

__device__ __forceinline__ float sigmoidOf(float x) { return 1.0f / (1.0f + __expf(-x)); }

template <typename T>
__global__ void swiGluForwardKernel(const T *__restrict__ gateUp, T *__restrict__ out, int64_t rows, int64_t width,
                                    int64_t outStride) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / width, col = i - row * width;
    const float g = static_cast<float>(gateUp[row * 2 * width + col]);
    const float u = static_cast<float>(gateUp[row * 2 * width + width + col]);
    out[row * outStride + col] = static_cast<T>(g * sigmoidOf(g) * u);
  }
}

/// The forward over 16-byte packs: one thread per pack of the output.
template <typename T>
__global__ void swiGluForwardPackedKernel(const T *__restrict__ gateUp, T *__restrict__ out, int64_t rows,
                                          int64_t width, int64_t outStride) {
  using P = Pack<T>;
  const int64_t packsPerRow = width / P::kSize, n = rows * packsPerRow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / packsPerRow, col = (i - row * packsPerRow) * P::kSize;
    const P g = P::load(gateUp + row * 2 * width + col), u = P::load(gateUp + row * 2 * width + width + col);
    P y;
#pragma unroll
    for (int j = 0; j < P::kSize; ++j)
      y.v[j] = g.v[j] * sigmoidOf(g.v[j]) * u.v[j];
    y.store(out + row * outStride + col);
  }
}

template <typename T>
__global__ void swiGluBackwardKernel(const T *__restrict__ gateUp, const T *__restrict__ gradOut,
                                     T *__restrict__ gradGateUp, int64_t rows, int64_t width, RowStrides strides) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / width, col = i - row * width;
    const int64_t gi = row * 2 * width + col, ui = gi + width;
    const float g = static_cast<float>(gateUp[gi]), u = static_cast<float>(gateUp[ui]);
    const float go = static_cast<float>(gradOut[row * strides.gradOut + col]);
    const float s = sigmoidOf(g);
    const int64_t di = row * strides.grad + col;
    gradGateUp[di] = static_cast<T>(go * u * s * (1.0f + g * (1.0f - s)));
    gradGateUp[di + width] = static_cast<T>(go * g * s);
  }
}

/// The backward over 16-byte packs.
template <typename T>
__global__ void swiGluBackwardPackedKernel(const T *__restrict__ gateUp, const T *__restrict__ gradOut,
                                           T *__restrict__ gradGateUp, int64_t rows, int64_t width,
                                           RowStrides strides) {
  using P = Pack<T>;
  const int64_t packsPerRow = width / P::kSize, n = rows * packsPerRow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / packsPerRow, col = (i - row * packsPerRow) * P::kSize;
    const int64_t gi = row * 2 * width + col, ui = gi + width;
    const P g = P::load(gateUp + gi), u = P::load(gateUp + ui), go = P::load(gradOut + row * strides.gradOut + col);
    P dg, du;
#pragma unroll
    for (int j = 0; j < P::kSize; ++j) {
      const float s = sigmoidOf(g.v[j]);
      dg.v[j] = go.v[j] * u.v[j] * s * (1.0f + g.v[j] * (1.0f - s));
      du.v[j] = go.v[j] * g.v[j] * s;
    }
    dg.store(gradGateUp + row * strides.grad + col);
    du.store(gradGateUp + row * strides.grad + width + col);
  }
}

int blocksFor(int64_t n) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int64_t cap = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

} // namespace

namespace {

/// Whether \p t is [rows, cols] with unit column stride and a row stride that
/// keeps 16-byte packs aligned when the width is packable.
bool rowMajor(const at::Tensor &t, int64_t rows, int64_t cols) {
  return t.dim() == 2 && t.size(0) == rows && t.size(1) == cols && (cols <= 1 || t.stride(1) == 1) &&
         t.stride(0) >= cols;
}

} // namespace

void swiGluForwardInto(const at::Tensor &gateUp, at::Tensor out) {
  const c10::cuda::CUDAGuard guard(gateUp.device());
  const int64_t rows = gateUp.size(0), width = gateUp.size(1) / 2;
  TORCH_CHECK(gateUp.is_contiguous() && rowMajor(out, rows, width) && out.scalar_type() == gateUp.scalar_type(),
              "swiGluForward: expected a contiguous [rows, 2W] input and a [rows, W] output of its dtype");
  if (out.numel() == 0)
    return;
  const int64_t outStride = out.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gateUp.scalar_type(), "swiGluForward", [&] {
    const scalar_t *in = gateUp.data_ptr<scalar_t>();
    scalar_t *y = out.data_ptr<scalar_t>();
    if (packable<scalar_t>(width, {in, y}) && outStride % Pack<scalar_t>::kSize == 0)
      swiGluForwardPackedKernel<scalar_t>
          <<<blocksFor(out.numel() / Pack<scalar_t>::kSize), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
              in, y, rows, width, outStride);
    else
      swiGluForwardKernel<scalar_t><<<blocksFor(out.numel()), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          in, y, rows, width, outStride);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor swiGluForward(const at::Tensor &gateUp) {
  at::Tensor out = at::empty({gateUp.size(0), gateUp.size(1) / 2}, gateUp.options());
  swiGluForwardInto(gateUp, out);
  return out;
}

void swiGluBackwardInto(const at::Tensor &gateUp, const at::Tensor &gradOut, at::Tensor grad) {
  const c10::cuda::CUDAGuard guard(gateUp.device());
  const int64_t rows = gateUp.size(0), width = gateUp.size(1) / 2;
  TORCH_CHECK(gateUp.is_contiguous() && rowMajor(gradOut, rows, width) && rowMajor(grad, rows, 2 * width) &&
                  gradOut.scalar_type() == gateUp.scalar_type() && grad.scalar_type() == gateUp.scalar_type(),
              "swiGluBackward: expected a contiguous [rows, 2W] input, a [rows, W] gradient and a [rows, 2W] "
              "result of its dtype");
  if (grad.numel() == 0)
    return;
  const RowStrides strides{gradOut.stride(0), grad.stride(0)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gateUp.scalar_type(), "swiGluBackward", [&] {
    const scalar_t *in = gateUp.data_ptr<scalar_t>(), *go = gradOut.data_ptr<scalar_t>();
    scalar_t *gi = grad.data_ptr<scalar_t>();
    constexpr int64_t kPack = Pack<scalar_t>::kSize;
    if (packable<scalar_t>(width, {in, go, gi}) && strides.gradOut % kPack == 0 && strides.grad % kPack == 0)
      swiGluBackwardPackedKernel<scalar_t>
          <<<blocksFor(rows * width / kPack), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(in, go, gi, rows,
                                                                                               width, strides);
    else
      swiGluBackwardKernel<scalar_t><<<blocksFor(rows * width), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          in, go, gi, rows, width, strides);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor swiGluBackward(const at::Tensor &gateUp, const at::Tensor &gradOut) {
  at::Tensor grad = at::empty_like(gateUp);
  swiGluBackwardInto(gateUp, gradOut.contiguous(), grad);
  return grad;
}

} // namespace adapt::rt::cuda
