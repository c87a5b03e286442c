//===- FactorLayoutKernel.cu - expert LoRA factors between two layouts ----===//
//
// Block (n, expert tile): the tile's [r, 128] slice of row n in the PEFT
// layout moves through shared memory (coalesced along experts on that
// side), and each thread owns one expert's r contiguous values on the
// other side (one 32-byte sector at r = 16).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/FactorLayoutKernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kExpertsPerBlock = 128;
constexpr int kMaxRank = 64;

__global__ void toExpertColumnsKernel(const float *__restrict__ factor, __nv_bfloat16 *__restrict__ columns,
                                      int64_t experts, int64_t rank, int64_t expertStride, int64_t rowStride,
                                      float scale) {
  __shared__ float tile[kMaxRank][kExpertsPerBlock];
  const int64_t n = blockIdx.x, e0 = int64_t(blockIdx.y) * kExpertsPerBlock;
  const int t = threadIdx.x;
  const float *row = factor + n * rank * experts;
  for (int64_t k = 0; k < rank; ++k)
    if (e0 + t < experts)
      tile[k][t] = row[k * experts + e0 + t];
  __syncthreads();
  if (e0 + t >= experts)
    return;
  __nv_bfloat16 *out = columns + (e0 + t) * expertStride + n * rowStride;
  for (int64_t k = 0; k < rank; k += 2)
    *reinterpret_cast<__nv_bfloat162 *>(out + k) = __floats2bfloat162_rn(tile[k][t] * scale, tile[k + 1][t] * scale);
}

dim3 gridFor(int64_t rows, int64_t experts) {
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>((experts + kExpertsPerBlock - 1) / kExpertsPerBlock));
}

} // namespace

bool factorToExpertColumns(const at::Tensor &factor, double scale, at::Tensor columns) {
  if (!factor.is_cuda() || factor.scalar_type() != at::kFloat || !factor.is_contiguous() || factor.dim() != 2 ||
      columns.dim() != 3 || columns.scalar_type() != at::kBFloat16 || columns.device() != factor.device())
    return false;
  const int64_t experts = columns.size(0), rows = columns.size(1), rank = columns.size(2);
  if (rank % 2 != 0 || rank > kMaxRank || factor.size(0) != rows || factor.size(1) != rank * experts ||
      columns.stride(2) != 1 || columns.stride(1) % 2 != 0 || columns.stride(0) % 2 != 0 ||
      reinterpret_cast<uintptr_t>(columns.data_ptr()) % 4 != 0 || rows == 0 || experts == 0)
    return false;
  const c10::cuda::CUDAGuard guard(factor.device());
  toExpertColumnsKernel<<<gridFor(rows, experts), kExpertsPerBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
      factor.data_ptr<float>(), reinterpret_cast<__nv_bfloat16 *>(columns.data_ptr()), experts, rank,
      columns.stride(0), columns.stride(1), static_cast<float>(scale));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

} // namespace adapt::rt::cuda
