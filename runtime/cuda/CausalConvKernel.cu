//===- CausalConvKernel.cu - the short causal convolution + SiLU ----------===//
//
// A thread per channel and run of kRun time steps of one sequence: it slides
// a window of the last K inputs down its run in registers, so every input is
// read once (plus K - 1 before the run) and every output written once. The
// warp's 32 threads are 32 neighbouring channels: each step reads and writes
// 32 consecutive elements of a row.
//
// Backward recomputes z = conv(x) and dz = dy silu'(z) as it goes, and
// finishes dx[t] = sum_j w[j] dz[t + K - 1 - j] once dz[t + K - 1] is known:
// a run goes K - 1 steps past its end (recomputing its neighbour's first
// dz), so runs never wait on each other. dw's partial sums (over the run's
// own steps) go to one slot per (run, channel), summed in a fixed order on
// the host.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/CausalConvKernel.h"
#include "runtime/cuda/Switches.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <type_traits>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 128; ///< Channels per block.
constexpr int kRun = 64;      ///< Time steps per thread.

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

/// Where a thread works: its channel, sequence and run [t0, t1).
struct Place {
  int64_t c, b, t0, t1;
  __device__ __forceinline__ Place(int64_t tokens, int64_t runs) {
    c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    b = blockIdx.y / runs;
    t0 = (blockIdx.y % runs) * int64_t(kRun);
    t1 = t0 + kRun < tokens ? t0 + kRun : tokens;
  }
};

template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
    causalConvSiluKernel(const T *__restrict__ x, const float *__restrict__ weight, T *__restrict__ y, int64_t tokens,
                         int64_t channels, int64_t runs) {
  const Place p(tokens, runs);
  if (p.c >= channels)
    return;
  float w[K], window[K];
#pragma unroll
  for (int j = 0; j < K; ++j)
    w[j] = weight[p.c * K + j];
  const T *xs = x + p.b * tokens * channels + p.c;
  T *ys = y + p.b * tokens * channels + p.c;
#pragma unroll
  for (int j = 0; j < K - 1; ++j) { // the K - 1 inputs before the run (zeros before t = 0)
    const int64_t t = p.t0 - (K - 1) + j;
    window[j] = t >= 0 ? static_cast<float>(xs[t * channels]) : 0.0f;
  }
  for (int64_t t = p.t0; t < p.t1; ++t) {
    window[K - 1] = static_cast<float>(xs[t * channels]);
    float z = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j)
      z += w[j] * window[j];
    ys[t * channels] = static_cast<T>(z * sigmoid(z));
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
      window[j] = window[j + 1];
  }
}

template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
    causalConvSiluBackwardKernel(const T *__restrict__ x, const float *__restrict__ weight,
                                 const T *__restrict__ gradOut, T *__restrict__ gradX, float *__restrict__ gradWeightPart,
                                 int64_t tokens, int64_t channels, int64_t runs) {
  const Place p(tokens, runs);
  if (p.c >= channels)
    return;
  float w[K], window[K], dzs[K], dw[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    w[j] = weight[p.c * K + j];
    dzs[j] = 0.0f; // dz before the run only feeds dx before the run: never read
    dw[j] = 0.0f;
  }
  const int64_t row0 = p.b * tokens * channels + p.c;
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int64_t t = p.t0 - (K - 1) + j;
    window[j] = t >= 0 ? static_cast<float>(x[row0 + t * channels]) : 0.0f;
  }
  // dz up to t1 + K - 2 (zero past the sequence): dx[t] needs dz[t .. t + K - 1].
  for (int64_t t = p.t0; t < p.t1 + K - 1; ++t) {
    float dz = 0.0f;
    if (t < tokens) {
      window[K - 1] = static_cast<float>(x[row0 + t * channels]);
      float z = 0.0f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        z += w[j] * window[j];
      const float s = sigmoid(z);
      dz = static_cast<float>(gradOut[row0 + t * channels]) * s * (1.0f + z * (1.0f - s));
      if (t < p.t1) // the run's own steps: dw
#pragma unroll
        for (int j = 0; j < K; ++j)
          dw[j] += dz * window[j];
#pragma unroll
      for (int j = 0; j < K - 1; ++j)
        window[j] = window[j + 1];
    }
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
      dzs[j] = dzs[j + 1];
    dzs[K - 1] = dz; // dzs[K - 1 - j] = dz[t - j]
    const int64_t done = t - (K - 1);
    if (done >= p.t0 && done < tokens) {
      float dx = 0.0f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        dx += w[j] * dzs[K - 1 - j]; // w[j] dz[done + K - 1 - j]
      gradX[row0 + done * channels] = static_cast<T>(dx);
    }
  }
  if (gradWeightPart != nullptr) {
    const int64_t slot = (p.b * runs + p.t0 / kRun) * channels + p.c;
#pragma unroll
    for (int j = 0; j < K; ++j)
      gradWeightPart[slot * K + j] = dw[j];
  }
}

/// Calls \p body with K as a compile-time constant (2, 3 or 4).
template <typename Body> void withKernelSize(int64_t k, Body body) {
  switch (k) {
  case 2: body(std::integral_constant<int, 2>()); break;
  case 3: body(std::integral_constant<int, 3>()); break;
  default: body(std::integral_constant<int, 4>()); break;
  }
}

/// The [C, K] fp32 weight of a [C, K] or [C, 1, K] one.
at::Tensor weightRows(const at::Tensor &weight, int64_t channels) {
  return weight.reshape({channels, -1}).to(at::kFloat).contiguous();
}

} // namespace

bool causalConvKernelEnabled() {
  static const bool on = !switchedOff("ADAPT_CONV_KERNEL");
  return on;
}

bool causalConvTakes(const at::Tensor &x, const at::Tensor &weight) {
  if (!x.is_cuda() || x.dim() != 3 || !x.is_contiguous() || weight.device() != x.device() ||
      !at::isFloatingType(weight.scalar_type()))
    return false;
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    return false;
  const int64_t channels = x.size(2);
  if (channels == 0 || weight.numel() % channels != 0 || weight.size(0) != channels)
    return false;
  const int64_t k = weight.numel() / channels;
  return k >= 2 && k <= 4 && x.size(0) * ((x.size(1) + kRun - 1) / kRun) <= 65535;
}

at::Tensor causalConvSilu(const at::Tensor &x, const at::Tensor &weight) {
  TORCH_CHECK(causalConvTakes(x, weight), "causalConvSilu: expected a contiguous CUDA x [B, T, C] and a [C, K] or "
                                          "[C, 1, K] weight with K of 2-4");
  const int64_t batch = x.size(0), tokens = x.size(1), channels = x.size(2);
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0)
    return out;
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor w = weightRows(weight, channels);
  const int64_t runs = (tokens + kRun - 1) / kRun;
  const dim3 grid(static_cast<unsigned>((channels + kThreads - 1) / kThreads), static_cast<unsigned>(batch * runs));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "causalConvSilu", [&] {
    withKernelSize(w.size(1), [&](auto k) {
      causalConvSiluKernel<scalar_t, decltype(k)::value><<<grid, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          x.data_ptr<scalar_t>(), w.data_ptr<float>(), out.data_ptr<scalar_t>(), tokens, channels, runs);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::pair<at::Tensor, at::Tensor> causalConvSiluBackward(const at::Tensor &x, const at::Tensor &weight,
                                                         const at::Tensor &gradOut, bool weightGrad) {
  TORCH_CHECK(causalConvTakes(x, weight) && gradOut.sizes() == x.sizes() && gradOut.device() == x.device(),
              "causalConvSiluBackward: expected x, weight as causalConvSilu takes them and a gradient shaped as x");
  const int64_t batch = x.size(0), tokens = x.size(1), channels = x.size(2);
  const at::Tensor w = weightRows(weight, channels);
  const int64_t k = w.size(1), runs = (tokens + kRun - 1) / kRun;
  const at::Tensor dy = gradOut.to(x.scalar_type()).contiguous();
  at::Tensor dx = at::empty_like(x);
  at::Tensor parts = weightGrad ? at::empty({batch * runs, channels, k}, w.options()) : at::Tensor();
  if (x.numel() > 0) {
    const c10::cuda::CUDAGuard guard(x.device());
    const dim3 grid(static_cast<unsigned>((channels + kThreads - 1) / kThreads), static_cast<unsigned>(batch * runs));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "causalConvSiluBackward", [&] {
      withKernelSize(k, [&](auto kk) {
        causalConvSiluBackwardKernel<scalar_t, decltype(kk)::value>
            <<<grid, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
                x.data_ptr<scalar_t>(), w.data_ptr<float>(), dy.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                weightGrad ? parts.data_ptr<float>() : nullptr, tokens, channels, runs);
      });
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  at::Tensor dw;
  if (weightGrad)
    dw = x.numel() > 0 ? parts.sum(0) : at::zeros_like(w);
  return {dx, dw};
}

} // namespace adapt::rt::cuda
