//===- RopeKernel.cu - rotary embedding in one pass each way --------------===//
//
// One thread per (row, pair), a block over whole rows: with i0, i1 the
// pair's two dims,
//   forward  y0 = x0 c0 - x1 s0,  y1 = x1 c1 + x0 s1
//   adjoint  y0 = x0 c0 + x1 s1,  y1 = x1 c1 - x0 s0
// (the adjoint is the forward's transpose, exact for any tables). Threads
// past the pairs copy the unrotated dims. Where rows and halves are whole
// 16-byte packs (Packed.cuh), a thread moves a pack of each at a time.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/RopeKernel.h"
#include "runtime/cuda/Packed.cuh"

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

/// One [B, H, T, D] row's input, output and table starts.
template <typename T> struct RotaryRow {
  const T *x;
  T *y;
  const float *cos, *sin;
};

/// Row \p row's starts: its index arithmetic, done once per row.
template <typename T>
__device__ __forceinline__ RotaryRow<T> rotaryRow(int64_t row, const T *x, T *y, const float *cos, const float *sin,
                                                  int64_t tableStride, RowStrides in, RowStrides out, int heads,
                                                  int seqLen) {
  const int t = static_cast<int>(row % seqLen);
  const int64_t bh = row / seqLen, h = bh % heads, b = bh / heads;
  return {x + b * in.b + h * in.h + t * in.t, y + b * out.b + h * out.h + t * out.t, cos + t * tableStride,
          sin + t * tableStride};
}

template <typename T>
__global__ void rotaryKernel(const T *__restrict__ x, T *__restrict__ y, const float *__restrict__ cos,
                             const float *__restrict__ sin, int64_t tableStride, RowStrides in, RowStrides out,
                             int heads, int seqLen, int dim, int rot, int64_t rows, bool interleaved, bool adjoint) {
  // Rows on blockIdx.x * blockDim.y + threadIdx.y, a row's pairs and copied
  // dims on threadIdx.x: the row's index arithmetic is done once per row.
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const RotaryRow<T> r = rotaryRow(row, x, y, cos, sin, tableStride, in, out, heads, seqLen);
  const T *xr = r.x;
  T *yr = r.y;
  const float *c = r.cos, *s = r.sin;
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

/// The same rotation over 16-byte packs, where every row start is 16-byte
/// aligned and the rotated half (or, interleaved, the rotated dims) and the
/// unrotated tail are whole packs: a thread takes one pack of each half of
/// the split layout (8 pairs in bf16), or one pack of adjacent pairs
/// interleaved, or one pack of the tail to copy.
template <typename T>
__global__ void rotaryPackedKernel(const T *__restrict__ x, T *__restrict__ y, const float *__restrict__ cos,
                                   const float *__restrict__ sin, int64_t tableStride, RowStrides in,
                                   RowStrides out, int heads, int seqLen, int dim, int rot, int64_t rows,
                                   bool interleaved, bool adjoint) {
  using P = Pack<T>;
  constexpr int N = P::kSize;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const RotaryRow<T> at = rotaryRow(row, x, y, cos, sin, tableStride, in, out, heads, seqLen);
  const int half = rot / 2, rotUnits = interleaved ? rot / N : half / N, units = rotUnits + (dim - rot) / N;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    if (u >= rotUnits) { // a pack of unrotated dims
      const int d = rot + (u - rotUnits) * N;
      *reinterpret_cast<uint4 *>(at.y + d) = *reinterpret_cast<const uint4 *>(at.x + d);
      continue;
    }
    if (interleaved) { // pairs (2j, 2j+1) inside one pack
      const int d = u * N;
      const P v = P::load(at.x + d);
      P r;
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const int i0 = d + i, i1 = i0 + 1;
        const float x0 = v.v[i], x1 = v.v[i + 1];
        r.v[i] = adjoint ? x0 * at.cos[i0] + x1 * at.sin[i1] : x0 * at.cos[i0] - x1 * at.sin[i0];
        r.v[i + 1] = adjoint ? x1 * at.cos[i1] - x0 * at.sin[i0] : x1 * at.cos[i1] + x0 * at.sin[i1];
      }
      r.store(at.y + d);
      continue;
    }
    const int d0 = u * N, d1 = d0 + half; // pairs (j, j + half), one pack of each half
    const P v0 = P::load(at.x + d0), v1 = P::load(at.x + d1);
    P r0, r1;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int i0 = d0 + i, i1 = d1 + i;
      const float x0 = v0.v[i], x1 = v1.v[i];
      r0.v[i] = adjoint ? x0 * at.cos[i0] + x1 * at.sin[i1] : x0 * at.cos[i0] - x1 * at.sin[i0];
      r1.v[i] = adjoint ? x1 * at.cos[i1] - x0 * at.sin[i0] : x1 * at.cos[i1] + x0 * at.sin[i1];
    }
    r0.store(at.y + d0);
    r1.store(at.y + d1);
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    constexpr int64_t N = Pack<scalar_t>::kSize;
    const bool packed = (interleaved ? rot % N == 0 : (rot / 2) % N == 0) && (dim - rot) % N == 0 &&
                        in.b % N == 0 && in.h % N == 0 && in.t % N == 0 && out.b % N == 0 && out.h % N == 0 &&
                        out.t % N == 0 && packable<scalar_t>(N, {x.data_ptr(), y.data_ptr()});
    if (packed) { // a row's packs on threadIdx.x, the rest of 256 threads over rows
      const int64_t units = (interleaved ? rot / N : rot / 2 / N) + (dim - rot) / N;
      const int perRowThreads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(units, 1)));
      const dim3 threads(perRowThreads, kThreads / perRowThreads);
      const int64_t blocks = (rows + threads.y - 1) / threads.y;
      rotaryPackedKernel<scalar_t><<<static_cast<unsigned>(blocks), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
          x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
          cos.stride(0), in, out, static_cast<int>(heads), static_cast<int>(seqLen), static_cast<int>(dim),
          static_cast<int>(rot), rows, interleaved, adjoint);
      return;
    }
    // A warp-multiple of threads per row (up to 128), the rest of 256 over rows.
    const int perRowThreads = static_cast<int>(std::min<int64_t>(128, (perRow + 31) / 32 * 32));
    const dim3 threads(perRowThreads, kThreads / perRowThreads);
    const int64_t blocks = (rows + threads.y - 1) / threads.y;
    rotaryKernel<scalar_t><<<static_cast<unsigned>(blocks), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(), cos.stride(0),
        in, out, static_cast<int>(heads), static_cast<int>(seqLen), static_cast<int>(dim), static_cast<int>(rot),
        rows, interleaved, adjoint);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

} // namespace adapt::rt::cuda
