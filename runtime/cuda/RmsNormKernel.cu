//===- RmsNormKernel.cu - RMSNorm in one pass each way --------------------===//
//
// One warp per row: pass one reduces the row's sum of squares (forward) or
// sum of w'*g*x (backward) with warp shuffles, pass two reads the row again
// (from L1, as the same warp just read it) and writes the result. Every
// access moves 16 bytes (Packed.cuh). The decoder's residual stream takes
// the residual forms: the add before the norm in the forward's pass one, and
// the residual path's gradient summed into the backward's output.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/RmsNormKernel.h"
#include "runtime/cuda/RowNorm.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <tuple>

namespace adapt::rt::cuda {

namespace {

using namespace rownorm;

/// The scale of element h: (w[h] + offset), or 1 without a weight.
template <typename W>
__device__ __forceinline__ float scaleAt(const W *weight, int64_t h, float offset) {
  return weight ? static_cast<float>(weight[h]) + offset : 1.0f;
}

/// The forward's second pass over one row: y = x * rstd * (w + offset), by
/// the row's warp (\p lane: this thread's).
template <typename T, typename W>
__device__ __forceinline__ void writeNormedRow(const T *x, const W *weight, T *y, int64_t width, int lane, float rstd,
                                               float offset) {
  using P = Pack<T>;
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    P v = P::load(x + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      v.v[i] = v.v[i] * rstd * scaleAt(weight, h + i, offset);
    v.store(y + h);
  }
}

template <typename T, typename W>
__global__ void rmsNormForwardKernel(const T *__restrict__ x, const W *__restrict__ weight, T *__restrict__ y,
                                     float *__restrict__ rstdOut, int64_t rows, int64_t width, float eps,
                                     float offset) {
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const T *in = x + row * width;
  const float rstd = rowRstd(in, width, lane, eps);
  if (lane == 0)
    rstdOut[row] = rstd;
  writeNormedRow(in, weight, y + row * width, width, lane, rstd, offset);
}

/// h = residual + branch, rounded to T as the composition's add stores it,
/// then the norm of that h: pass one writes h and reduces its squares, pass
/// two reads back what this lane wrote (its own stores, from L1/L2) and
/// writes y.
template <typename T, typename W>
__global__ void residualRmsNormForwardKernel(const T *__restrict__ residual, const T *__restrict__ branch,
                                             const W *__restrict__ weight, T *__restrict__ sum, T *__restrict__ y,
                                             float *__restrict__ rstdOut, int64_t rows, int64_t width, float eps,
                                             float offset) {
  using P = Pack<T>;
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const int64_t base = row * width;
  float squares = 0.0f;
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    P u = P::load(residual + base + h);
    const P v = P::load(branch + base + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i) {
      u.v[i] = static_cast<float>(static_cast<T>(u.v[i] + v.v[i]));
      squares += u.v[i] * u.v[i];
    }
    u.store(sum + base + h);
  }
  const float rstd = rsqrtf(warpSum(squares) / static_cast<float>(width) + eps);
  if (lane == 0)
    rstdOut[row] = rstd;
  writeNormedRow(sum + base, weight, y + base, width, lane, rstd, offset);
}

/// d x of the norm, plus \p gradResidual (nullable): the gradient that
/// reaches x along the residual stream, summed here instead of by autograd.
template <typename T, typename W>
__global__ void rmsNormBackwardKernel(const T *__restrict__ x, const W *__restrict__ weight,
                                      const float *__restrict__ rstdIn, const T *__restrict__ gradY,
                                      const T *__restrict__ gradResidual, T *__restrict__ gradX, int64_t rows,
                                      int64_t width, float offset) {
  using P = Pack<T>;
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const T *in = x + row * width, *g = gradY + row * width;
  float dot = 0.0f;
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    const P v = P::load(in + h), d = P::load(g + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      dot += v.v[i] * d.v[i] * scaleAt(weight, h + i, offset);
  }
  const float rstd = rstdIn[row];
  // d x = rstd * w' g - x * rstd^3 * sum(w' g x) / D
  const float correction = warpSum(dot) * rstd * rstd * rstd / static_cast<float>(width);
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    const P v = P::load(in + h), d = P::load(g + h);
    P out;
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      out.v[i] = rstd * d.v[i] * scaleAt(weight, h + i, offset) - v.v[i] * correction;
    if (gradResidual) {
      const P r = P::load(gradResidual + row * width + h);
#pragma unroll
      for (int i = 0; i < P::kSize; ++i)
        out.v[i] += r.v[i];
    }
    out.store(gradX + row * width + h);
  }
}

/// Runs \p body with scalar_t (x's dtype) and weight_t (the weight's dtype,
/// x's when there is none).
template <typename Body>
void dispatchTypes(const at::Tensor &x, const at::Tensor &weight, const Body &body) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rmsNorm", [&] {
    using scalar_t_ = scalar_t;
    const auto wType = weight.defined() ? weight.scalar_type() : x.scalar_type();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, wType, "rmsNormWeight", [&] {
      body(scalar_t_(), scalar_t());
    });
  });
}

} // namespace

bool rmsNormKernelFits(const at::Tensor &x, const at::Tensor &weight) {
  const auto type = x.scalar_type();
  if (!x.is_cuda() || x.dim() == 0 || x.numel() == 0 ||
      (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf))
    return false;
  const int64_t width = x.size(-1), elems = 16 / static_cast<int64_t>(x.element_size());
  if (width % elems != 0 || width > 64 * 1024)
    return false;
  return !weight.defined() || (weight.dim() == 1 && weight.size(0) == width && weight.device() == x.device());
}

std::pair<at::Tensor, at::Tensor> rmsNormForward(const at::Tensor &x, const at::Tensor &weight, double eps,
                                                 double offset) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous(), w = weight.defined() ? weight.contiguous() : at::Tensor();
  const int64_t width = in.size(-1), rows = in.numel() / width;
  at::Tensor y = at::empty_like(in), rstd = at::empty({rows}, in.options().dtype(at::kFloat));
  dispatchTypes(in, w, [&](auto xTag, auto wTag) {
    using T = decltype(xTag);
    using W = decltype(wTag);
    rmsNormForwardKernel<T, W><<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.data_ptr<T>(), w.defined() ? w.data_ptr<W>() : nullptr, y.data_ptr<T>(), rstd.data_ptr<float>(), rows,
        width, static_cast<float>(eps), static_cast<float>(offset));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> residualRmsNormForward(const at::Tensor &residual,
                                                                     const at::Tensor &branch,
                                                                     const at::Tensor &weight, double eps,
                                                                     double offset) {
  TORCH_CHECK(branch.sizes() == residual.sizes() && branch.scalar_type() == residual.scalar_type() &&
                  branch.device() == residual.device(),
              "residualRmsNormForward: expected the branch like the residual ", residual.sizes(), ", found ",
              branch.sizes());
  const c10::cuda::CUDAGuard guard(residual.device());
  const at::Tensor r = residual.contiguous(), a = branch.contiguous();
  const at::Tensor w = weight.defined() ? weight.contiguous() : at::Tensor();
  const int64_t width = r.size(-1), rows = r.numel() / width;
  at::Tensor sum = at::empty_like(r), y = at::empty_like(r), rstd = at::empty({rows}, r.options().dtype(at::kFloat));
  dispatchTypes(r, w, [&](auto xTag, auto wTag) {
    using T = decltype(xTag);
    using W = decltype(wTag);
    residualRmsNormForwardKernel<T, W><<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        r.data_ptr<T>(), a.data_ptr<T>(), w.defined() ? w.data_ptr<W>() : nullptr, sum.data_ptr<T>(),
        y.data_ptr<T>(), rstd.data_ptr<float>(), rows, width, static_cast<float>(eps), static_cast<float>(offset));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {sum, y, rstd};
}

at::Tensor rmsNormBackward(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &rstd,
                           const at::Tensor &gradY, double offset, const at::Tensor &gradResidual) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous(), g = gradY.contiguous(), w = weight.defined() ? weight.contiguous() : at::Tensor();
  const at::Tensor res = gradResidual.defined() ? gradResidual.to(in.scalar_type()).contiguous() : at::Tensor();
  TORCH_CHECK(!res.defined() || res.sizes() == in.sizes(), "rmsNormBackward: expected the residual gradient ",
              in.sizes(), ", found ", res.sizes());
  const int64_t width = in.size(-1), rows = in.numel() / width;
  at::Tensor gradX = at::empty_like(in);
  dispatchTypes(in, w, [&](auto xTag, auto wTag) {
    using T = decltype(xTag);
    using W = decltype(wTag);
    rmsNormBackwardKernel<T, W><<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.data_ptr<T>(), w.defined() ? w.data_ptr<W>() : nullptr, rstd.data_ptr<float>(), g.data_ptr<T>(),
        res.defined() ? res.data_ptr<T>() : nullptr, gradX.data_ptr<T>(), rows, width, static_cast<float>(offset));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return gradX;
}

} // namespace adapt::rt::cuda
