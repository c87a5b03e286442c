//===- L2NormKernel.cu - the delta rule's query and key normalisation -----===//
//
// A warp per row over 16-byte packs (RowNorm.cuh); rows are addressed through
// up to three leading dimensions with their own strides, so the strided
// views the layers hand over are read in place.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/L2NormKernel.h"
#include "runtime/cuda/RowNorm.cuh"
#include "runtime/cuda/Switches.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <array>

namespace adapt::rt::cuda {

namespace {

using namespace rownorm;

/// Rows of a tensor of up to four dimensions: the three leading sizes and
/// strides (in elements; leading ones of size 1 for fewer dimensions).
struct RowLayout {
  int64_t size[3], stride[3];

  __device__ __forceinline__ int64_t offset(int64_t row) const {
    const int64_t c = row % size[2], rest = row / size[2];
    return (rest / size[1]) * stride[0] + (rest % size[1]) * stride[1] + c * stride[2];
  }
};

RowLayout layoutOf(const at::Tensor &x) {
  RowLayout l{{1, 1, 1}, {0, 0, 0}};
  const int64_t lead = x.dim() - 1;
  for (int64_t i = 0; i < lead; ++i) {
    l.size[3 - lead + i] = x.size(i);
    l.stride[3 - lead + i] = x.stride(i);
  }
  return l;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    l2NormForwardKernel(const T *__restrict__ x, RowLayout in, T *__restrict__ y, float *__restrict__ rOut,
                        int64_t rows, int width, float eps) {
  using P = Pack<T>;
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const T *src = x + in.offset(row);
  const float r = rsqrtf(rowSquares(src, width, lane) + eps);
  if (lane == 0)
    rOut[row] = r;
  for (int h = lane * P::kSize; h < width; h += 32 * P::kSize) {
    P v = P::load(src + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      v.v[i] *= r;
    v.store(y + row * width + h);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    l2NormBackwardKernel(const T *__restrict__ x, RowLayout in, const float *__restrict__ rIn,
                         const T *__restrict__ gradY, RowLayout grads, T *__restrict__ gradX, int64_t rows,
                         int width) {
  using P = Pack<T>;
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const T *src = x + in.offset(row), *dy = gradY + grads.offset(row);
  float dot = 0.0f;
  for (int h = lane * P::kSize; h < width; h += 32 * P::kSize) {
    const P v = P::load(src + h), d = P::load(dy + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      dot += d.v[i] * v.v[i];
  }
  const float r = rIn[row], correction = warpSum(dot) * r * r * r;
  for (int h = lane * P::kSize; h < width; h += 32 * P::kSize) {
    const P v = P::load(src + h), d = P::load(dy + h);
    P dx;
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      dx.v[i] = r * d.v[i] - v.v[i] * correction;
    dx.store(gradX + row * width + h);
  }
}

} // namespace

bool l2NormKernelEnabled() {
  static const bool on = !switchedOff("ADAPT_L2NORM_KERNEL");
  return on;
}

bool l2NormFits(const at::Tensor &x) {
  const auto type = x.scalar_type();
  if (!x.is_cuda() || x.dim() < 1 || x.dim() > 4 || x.numel() == 0 ||
      (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf))
    return false;
  const int64_t pack = 16 / static_cast<int64_t>(x.element_size()), width = x.size(-1);
  if (x.stride(-1) != 1 || width % pack != 0 || width > 8192 || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16)
    return false;
  for (int64_t i = 0; i + 1 < x.dim(); ++i)
    if (x.stride(i) % pack != 0)
      return false;
  return true;
}

std::pair<at::Tensor, at::Tensor> l2NormForward(const at::Tensor &x, double eps) {
  TORCH_CHECK(l2NormFits(x), "l2NormForward: expected CUDA rows of a packable width, at most four dimensions");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t width = x.size(-1), rows = x.numel() / width;
  at::Tensor y = at::empty(x.sizes(), x.options()), r = at::empty({rows}, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "l2NormForward", [&] {
    l2NormForwardKernel<scalar_t><<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), layoutOf(x), y.data_ptr<scalar_t>(), r.data_ptr<float>(), rows,
        static_cast<int>(width), static_cast<float>(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, r};
}

at::Tensor l2NormBackward(const at::Tensor &x, const at::Tensor &r, const at::Tensor &gradY) {
  TORCH_CHECK(l2NormFits(x) && gradY.sizes() == x.sizes() && r.numel() * x.size(-1) == x.numel(),
              "l2NormBackward: expected the forward's x and r, and a gradient shaped as x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dy = gradY.scalar_type() == x.scalar_type() ? gradY : gradY.to(x.scalar_type());
  if (!l2NormFits(dy)) // a fresh copy is contiguous and aligned
    dy = dy.clone(at::MemoryFormat::Contiguous);
  const int64_t width = x.size(-1), rows = x.numel() / width;
  at::Tensor dx = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "l2NormBackward", [&] {
    l2NormBackwardKernel<scalar_t><<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), layoutOf(x), r.data_ptr<float>(), dy.data_ptr<scalar_t>(), layoutOf(dy),
        dx.data_ptr<scalar_t>(), rows, static_cast<int>(width));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dx;
}

} // namespace adapt::rt::cuda
