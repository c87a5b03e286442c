//===- OuterSumKernel.cu - LoRA weight gradients of grouped rows ----------===//
//
// Block (column tile, expert): 128 threads, one column each, r fp32 sums in
// registers. The expert's rows go by in stages of 32: the stage's rank-r
// rows are widened into shared memory (every thread then reads the same
// address: a broadcast), and each thread reads its column of the wide rows
// (a warp reads 64 contiguous bytes per row).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/OuterSumKernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kColumns = 128; ///< Columns per block, one per thread.
constexpr int kStage = 32;    ///< Rows per shared-memory stage.

template <int R>
__global__ void groupedOuterSumKernel(const __nv_bfloat16 *__restrict__ narrow, int64_t narrowStride,
                                      const __nv_bfloat16 *__restrict__ wide, int64_t wideStride,
                                      const int32_t *__restrict__ offsets, int64_t width, float scale,
                                      float *__restrict__ out, int64_t sE, int64_t sK, int64_t sN) {
  __shared__ __align__(16) float stage[kStage][R];
  const int e = blockIdx.y;
  const int64_t n = int64_t(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t begin = e == 0 ? 0 : offsets[e - 1], end = offsets[e];
  float acc[R];
#pragma unroll
  for (int k = 0; k < R; ++k)
    acc[k] = 0.0f;
  for (int64_t r0 = begin; r0 < end; r0 += kStage) {
    const int rows = static_cast<int>(min(int64_t(kStage), end - r0));
    __syncthreads(); // the previous stage is read
    for (int idx = threadIdx.x; idx < rows * R; idx += kColumns) {
      const int i = idx / R, k = idx % R;
      stage[i][k] = __bfloat162float(narrow[(r0 + i) * narrowStride + k]);
    }
    __syncthreads();
    if (n < width) {
      const __nv_bfloat16 *column = wide + r0 * wideStride + n;
#pragma unroll 4
      for (int i = 0; i < rows; ++i) {
        const float w = __bfloat162float(column[i * wideStride]);
        const float4 *s = reinterpret_cast<const float4 *>(stage[i]);
#pragma unroll
        for (int q = 0; q < R / 4; ++q) {
          const float4 v = s[q];
          acc[4 * q] += v.x * w;
          acc[4 * q + 1] += v.y * w;
          acc[4 * q + 2] += v.z * w;
          acc[4 * q + 3] += v.w * w;
        }
      }
    }
  }
  if (n >= width)
    return;
  float *o = out + e * sE + n * sN;
#pragma unroll
  for (int k = 0; k < R; ++k)
    o[k * sK] = acc[k] * scale;
}

} // namespace

bool groupedOuterSum(const at::Tensor &narrow, const at::Tensor &wide, const at::Tensor &offsets, double scale,
                     at::Tensor &out, int64_t strideExpert, int64_t strideRank, int64_t strideColumn) {
  if (!narrow.is_cuda() || narrow.scalar_type() != at::kBFloat16 || wide.scalar_type() != at::kBFloat16 ||
      narrow.dim() != 2 || wide.dim() != 2 || narrow.size(0) != wide.size(0) || narrow.stride(1) != 1 ||
      wide.stride(1) != 1 || offsets.scalar_type() != at::kInt || !offsets.is_contiguous() ||
      out.scalar_type() != at::kFloat || !out.is_cuda() || wide.device() != narrow.device() ||
      offsets.device() != narrow.device() || out.device() != narrow.device())
    return false;
  const int64_t rank = narrow.size(1), width = wide.size(1), experts = offsets.size(0);
  if (rank % 8 != 0 || rank > 32 || experts == 0 || width == 0 || experts > 65535 ||
      out.numel() != experts * rank * width)
    return false;
  const c10::cuda::CUDAGuard guard(narrow.device());
  const dim3 grid(static_cast<unsigned>((width + kColumns - 1) / kColumns), static_cast<unsigned>(experts));
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto rankTag) {
    constexpr int R = decltype(rankTag)::value;
    groupedOuterSumKernel<R><<<grid, kColumns, 0, stream>>>(
        reinterpret_cast<const __nv_bfloat16 *>(narrow.data_ptr()), narrow.stride(0),
        reinterpret_cast<const __nv_bfloat16 *>(wide.data_ptr()), wide.stride(0), offsets.data_ptr<int32_t>(),
        width, static_cast<float>(scale), out.data_ptr<float>(), strideExpert, strideRank, strideColumn);
  };
  switch (rank) {
  case 8: launch(std::integral_constant<int, 8>()); break;
  case 16: launch(std::integral_constant<int, 16>()); break;
  case 24: launch(std::integral_constant<int, 24>()); break;
  default: launch(std::integral_constant<int, 32>()); break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

} // namespace adapt::rt::cuda
