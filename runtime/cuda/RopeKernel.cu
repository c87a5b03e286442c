//===- RopeKernel.cu - rotary embedding in one pass each way --------------===//
//
// One thread per (row, pair), a block over whole rows: with i0, i1 the
// pair's two dims,
//   forward  y0 = x0 c0 - x1 s0,  y1 = x1 c1 + x0 s1
//   adjoint  y0 = x0 c0 + x1 s1,  y1 = x1 c1 - x0 s0
// (the adjoint is the forward's transpose, exact for any tables). Threads
// past the pairs copy the unrotated dims.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/RopeKernel.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 256;

/// Strides of a [B, H, T, D] tensor (elements), the last one 1.
struct RowStrides {
  int64_t b, h, t;
};

template <typename T>
__global__ void rotaryKernel(const T *__restrict__ x, T *__restrict__ y, const float *__restrict__ cos,
                             const float *__restrict__ sin, int64_t tableStride, RowStrides in, RowStrides out,
                             int heads, int seqLen, int dim, int rot, int64_t rows, bool interleaved, bool adjoint) {
  // Rows on blockIdx.x * blockDim.y + threadIdx.y, a row's pairs and copied
  // dims on threadIdx.x: the row's index arithmetic is done once per row.
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const int t = static_cast<int>(row % seqLen);
  const int64_t bh = row / seqLen, h = bh % heads, b = bh / heads;
  const T *xr = x + b * in.b + h * in.h + t * in.t;
  T *yr = y + b * out.b + h * out.h + t * out.t;
  const float *c = cos + t * tableStride, *s = sin + t * tableStride;
  const int half = rot / 2, perRow = half + (dim - rot);
  for (int j = threadIdx.x; j < perRow; j += blockDim.x) {
    if (j >= half) { // an unrotated dim
      const int d = rot + (j - half);
      yr[d] = xr[d];
      continue;
    }
    const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
    const float x0 = static_cast<float>(xr[i0]), x1 = static_cast<float>(xr[i1]);
    if (adjoint) {
      yr[i0] = static_cast<T>(x0 * c[i0] + x1 * s[i1]);
      yr[i1] = static_cast<T>(x1 * c[i1] - x0 * s[i0]);
    } else {
      yr[i0] = static_cast<T>(x0 * c[i0] - x1 * s[i0]);
      yr[i1] = static_cast<T>(x1 * c[i1] + x0 * s[i1]);
    }
  }
}

} // namespace

at::Tensor rotary(const at::Tensor &x, const at::Tensor &cos, const at::Tensor &sin, bool interleaved,
                  bool adjoint) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "rotary: expected x [B, H, T, D] with a unit last stride");
  TORCH_CHECK(cos.dim() == 2 && sin.sizes() == cos.sizes() && cos.size(0) == x.size(2) && cos.size(1) % 2 == 0 &&
                  cos.size(1) <= x.size(3) && cos.stride(1) == 1 && sin.stride(1) == 1 &&
                  sin.stride(0) == cos.stride(0) && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "rotary: expected fp32 tables [T, rot] (rot even, at most D) with unit last strides");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  if (y.numel() == 0)
    return y;
  const int64_t heads = x.size(1), seqLen = x.size(2), dim = x.size(3), rot = cos.size(1);
  const int64_t rows = x.size(0) * heads * seqLen, perRow = rot / 2 + dim - rot;
  const RowStrides in{x.stride(0), x.stride(1), x.stride(2)}, out{y.stride(0), y.stride(1), y.stride(2)};
  TORCH_CHECK(y.stride(3) == 1, "rotary: the output lost the unit last stride");
  // A warp-multiple of threads per row (up to 128), the rest of 256 over rows.
  const int perRowThreads = static_cast<int>(std::min<int64_t>(128, (perRow + 31) / 32 * 32));
  const dim3 threads(perRowThreads, kThreads / perRowThreads);
  const int64_t blocks = (rows + threads.y - 1) / threads.y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    rotaryKernel<scalar_t><<<static_cast<unsigned>(blocks), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(), cos.stride(0),
        in, out, static_cast<int>(heads), static_cast<int>(seqLen), static_cast<int>(dim), static_cast<int>(rot),
        rows, interleaved, adjoint);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

} // namespace adapt::rt::cuda
