//===- SparseScatterKernel.cu - sparse attention's key-gradient scatter ---===//
//
// One block per gradient row; each thread moves four columns: it widens the
// row's (and, on the values' columns, the value gradient's) elements to
// fp32, adds them, and accumulates them with one 16-byte atomic add (sm_90
// has float4 atomics on global memory; older GPUs take four scalar ones).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/SparseScatterKernel.h"
#include "runtime/cuda/Packed.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 128;

/// Four consecutive elements of T, widened to float.
template <typename T> __device__ __forceinline__ float4 loadFour(const T *p) {
  return make_float4(static_cast<float>(p[0]), static_cast<float>(p[1]), static_cast<float>(p[2]),
                     static_cast<float>(p[3]));
}

template <typename T>
__global__ void sparseKeyScatterKernel(float *__restrict__ accumulator, const int64_t *__restrict__ rows,
                                       const T *__restrict__ keyGrads, const T *__restrict__ valueGrads,
                                       int64_t width, int64_t valueWidth) {
  const int64_t i = blockIdx.x, dest = rows[i];
  const T *key = keyGrads + i * width;
  const T *value = valueGrads ? valueGrads + i * valueWidth : nullptr;
  float *out = accumulator + dest * width;
  for (int64_t c = int64_t(threadIdx.x) * 4; c < width; c += int64_t(blockDim.x) * 4) {
    float4 v = loadFour(key + c);
    if (value && c < valueWidth) {
      const float4 w = loadFour(value + c);
      v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
    }
    atomicAddFour(out + c, v);
  }
}

} // namespace

bool scatterAddKeyGradients(at::Tensor &accumulator, const at::Tensor &rows, const at::Tensor &keyGrads,
                            const at::Tensor &valueGrads) {
  const bool hasValues = valueGrads.defined();
  const int64_t n = rows.numel(), width = keyGrads.dim() == 2 ? keyGrads.size(1) : -1;
  const int64_t valueWidth = hasValues && valueGrads.dim() == 2 ? valueGrads.size(1) : 0;
  const bool fits = accumulator.is_cuda() && accumulator.scalar_type() == at::kFloat && accumulator.is_contiguous() &&
                    accumulator.dim() == 2 && accumulator.size(1) == width && width % 4 == 0 &&
                    keyGrads.is_contiguous() && keyGrads.size(0) == n && rows.scalar_type() == at::kLong &&
                    rows.is_contiguous() &&
                    (!hasValues || (valueGrads.is_contiguous() && valueGrads.size(0) == n && valueWidth <= width &&
                                    valueWidth % 4 == 0 && valueGrads.scalar_type() == keyGrads.scalar_type()));
  if (!fits)
    return false;
  if (n == 0)
    return true;
  const c10::cuda::CUDAGuard guard(accumulator.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, keyGrads.scalar_type(), "scatterAddKeyGradients", [&] {
    sparseKeyScatterKernel<scalar_t><<<static_cast<unsigned>(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        accumulator.data_ptr<float>(), rows.data_ptr<int64_t>(), keyGrads.data_ptr<scalar_t>(),
        hasValues ? valueGrads.data_ptr<scalar_t>() : nullptr, width, valueWidth);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

} // namespace adapt::rt::cuda
