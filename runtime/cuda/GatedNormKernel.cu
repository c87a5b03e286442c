//===- GatedNormKernel.cu - the linear-attention output's gated norm ------===//
//
// One warp per row over 16-byte packs (RowNorm.cuh): pass one reduces
// the row's sum of squares (forward) or sum of dn * x (backward) with warp
// shuffles, pass two reads the row again (from L1) and writes the result.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/GatedNormKernel.h"
#include "runtime/cuda/RowNorm.cuh"
#include "runtime/cuda/Switches.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <type_traits>

namespace adapt::rt::cuda {

namespace {

using namespace rownorm;

/// The gate's activation and its derivative.
template <NormGate G> struct Gate;
template <> struct Gate<NormGate::Silu> {
  __device__ __forceinline__ static float value(float g) { return g / (1.0f + expf(-g)); }
  __device__ __forceinline__ static float slope(float g) {
    const float s = 1.0f / (1.0f + expf(-g));
    return s * (1.0f + g * (1.0f - s));
  }
};
template <> struct Gate<NormGate::Sigmoid> {
  __device__ __forceinline__ static float value(float g) { return 1.0f / (1.0f + expf(-g)); }
  __device__ __forceinline__ static float slope(float g) {
    const float s = 1.0f / (1.0f + expf(-g));
    return s * (1.0f - s);
  }
};

template <typename T, typename W, NormGate G>
__global__ void __launch_bounds__(kThreads)
    gatedNormForwardKernel(const T *__restrict__ x, const T *__restrict__ gate, const W *__restrict__ weight,
                           T *__restrict__ y, float *__restrict__ rstdOut, int64_t rows, int64_t width, float eps) {
  using P = Pack<T>;
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const T *in = x + row * width, *gs = gate + row * width;
  const float rstd = rowRstd(in, width, lane, eps);
  if (lane == 0)
    rstdOut[row] = rstd;
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    P v = P::load(in + h);
    const P g = P::load(gs + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      v.v[i] = static_cast<float>(weight[h + i]) * v.v[i] * rstd * Gate<G>::value(g.v[i]);
    v.store(y + row * width + h);
  }
}

template <typename T, typename W, NormGate G>
__global__ void __launch_bounds__(kThreads)
    gatedNormBackwardKernel(const T *__restrict__ x, const T *__restrict__ gate, const W *__restrict__ weight,
                            const float *__restrict__ rstdIn, const T *__restrict__ gradY, T *__restrict__ gradX,
                            T *__restrict__ gradGate, int64_t rows, int64_t width) {
  using P = Pack<T>;
  const int lane = threadIdx.x % 32;
  const int64_t row = warpRow();
  if (row >= rows)
    return;
  const int64_t base = row * width;
  // dn = dy w act(g), the gradient of n = x rstd; dx = rstd dn - x rstd^3 sum(dn x) / D.
  float dot = 0.0f;
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    const P v = P::load(x + base + h), g = P::load(gate + base + h), d = P::load(gradY + base + h);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      dot += d.v[i] * static_cast<float>(weight[h + i]) * Gate<G>::value(g.v[i]) * v.v[i];
  }
  const float rstd = rstdIn[row];
  const float correction = warpSum(dot) * rstd * rstd * rstd / static_cast<float>(width);
  for (int64_t h = lane * int64_t(P::kSize); h < width; h += 32 * P::kSize) {
    const P v = P::load(x + base + h), g = P::load(gate + base + h), d = P::load(gradY + base + h);
    P dx, dg;
#pragma unroll
    for (int i = 0; i < P::kSize; ++i) {
      const float dw = d.v[i] * static_cast<float>(weight[h + i]);
      dx.v[i] = rstd * dw * Gate<G>::value(g.v[i]) - v.v[i] * correction;
      dg.v[i] = dw * v.v[i] * rstd * Gate<G>::slope(g.v[i]);
    }
    dx.store(gradX + base + h);
    dg.store(gradGate + base + h);
  }
}

/// Runs \p body with x's and the weight's element types and the gate kind.
template <typename Body>
void dispatch(const at::Tensor &x, const at::Tensor &weight, NormGate kind, const Body &body) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gatedNorm", [&] {
    using scalar_t_ = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, weight.scalar_type(), "gatedNormWeight", [&] {
      if (kind == NormGate::Silu)
        body(scalar_t_(), scalar_t(), std::integral_constant<NormGate, NormGate::Silu>());
      else
        body(scalar_t_(), scalar_t(), std::integral_constant<NormGate, NormGate::Sigmoid>());
    });
  });
}

} // namespace

bool gatedNormKernelEnabled() {
  static const bool on = !switchedOff("ADAPT_GATED_NORM_KERNEL");
  return on;
}

bool gatedNormFits(const at::Tensor &x, const at::Tensor &gate, const at::Tensor &weight) {
  const auto type = x.scalar_type();
  if (!x.is_cuda() || x.dim() == 0 || x.numel() == 0 ||
      (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf))
    return false;
  if (gate.sizes() != x.sizes() || gate.scalar_type() != type || gate.device() != x.device())
    return false;
  const int64_t width = x.size(-1), elems = 16 / static_cast<int64_t>(x.element_size());
  return width % elems == 0 && width <= 64 * 1024 && weight.defined() && weight.dim() == 1 &&
         weight.size(0) == width && weight.device() == x.device() && at::isFloatingType(weight.scalar_type());
}

std::pair<at::Tensor, at::Tensor> gatedNormForward(const at::Tensor &x, const at::Tensor &gate,
                                                   const at::Tensor &weight, double eps, NormGate kind) {
  TORCH_CHECK(gatedNormFits(x, gate, weight), "gatedNormForward: expected CUDA x and gate of one shape and dtype "
                                              "with a packable last dim D and a weight [D]");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous(), g = gate.contiguous(), w = weight.contiguous();
  const int64_t width = in.size(-1), rows = in.numel() / width;
  at::Tensor y = at::empty_like(in), rstd = at::empty({rows}, in.options().dtype(at::kFloat));
  dispatch(in, w, kind, [&](auto xTag, auto wTag, auto gateTag) {
    using T = decltype(xTag);
    using W = decltype(wTag);
    gatedNormForwardKernel<T, W, decltype(gateTag)::value>
        <<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
            in.data_ptr<T>(), g.data_ptr<T>(), w.data_ptr<W>(), y.data_ptr<T>(), rstd.data_ptr<float>(), rows, width,
            static_cast<float>(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, rstd};
}

std::pair<at::Tensor, at::Tensor> gatedNormBackward(const at::Tensor &x, const at::Tensor &gate,
                                                    const at::Tensor &weight, const at::Tensor &rstd,
                                                    const at::Tensor &gradY, NormGate kind) {
  TORCH_CHECK(gatedNormFits(x, gate, weight) && gradY.sizes() == x.sizes() && rstd.numel() * x.size(-1) == x.numel(),
              "gatedNormBackward: expected the forward's x, gate, weight and rstd, and a gradient shaped as x");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous(), g = gate.contiguous(), w = weight.contiguous();
  const at::Tensor dy = gradY.to(in.scalar_type()).contiguous(), r = rstd.contiguous();
  const int64_t width = in.size(-1), rows = in.numel() / width;
  at::Tensor dx = at::empty_like(in), dg = at::empty_like(in);
  dispatch(in, w, kind, [&](auto xTag, auto wTag, auto gateTag) {
    using T = decltype(xTag);
    using W = decltype(wTag);
    gatedNormBackwardKernel<T, W, decltype(gateTag)::value>
        <<<blocksFor(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
            in.data_ptr<T>(), g.data_ptr<T>(), w.data_ptr<W>(), r.data_ptr<float>(), dy.data_ptr<T>(),
            dx.data_ptr<T>(), dg.data_ptr<T>(), rows, width);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dx, dg};
}

} // namespace adapt::rt::cuda
