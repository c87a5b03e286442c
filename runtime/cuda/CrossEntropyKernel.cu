//===- CrossEntropyKernel.cu - softmax cross-entropy over logit rows ------===//
//
// The elementwise half of the fused LM head and loss (runtime/LinearCrossEntropy.cpp)
// in one kernel: per row of logits (any float dtype, read as fp32), the
// log-sum-exp by an online max/sum, the row's loss, and, when asked, the
// gradient softmax - one-hot written over the logits in their own dtype.
// The composition it replaces reads and writes the row five to six times in
// fp32; this reads it twice and writes it once in bf16. Rows whose width is a
// multiple of 16 bytes move in 16-byte packs (two in flight per thread), which
// the scalar form's 2-byte accesses left at a fifth of the bandwidth.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/CrossEntropyKernel.h"
#include "runtime/cuda/Packed.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cfloat>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int64_t kIgnoreIndex = -100;

/// (max, sum of exp(x - max)) of two parts, combined.
__device__ __forceinline__ void combine(float &m, float &s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY)
    return; // both parts empty
  s = s * __expf(m - top) + s2 * __expf(m2 - top);
  m = top;
}

/// Folds the values \p v[0..N) into the running (max, sum of exp(x - max)):
/// one rescale of the sum per group instead of a branch per element.
template <int N>
__device__ __forceinline__ void accumulate(float &m, float &s, const float *v) {
  float top = v[0];
#pragma unroll
  for (int i = 1; i < N; ++i)
    top = fmaxf(top, v[i]);
  if (top == -INFINITY)
    return; // nothing to add (and exp(-inf - -inf) would be NaN)
  if (top > m) {
    s *= __expf(m - top);
    m = top;
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    s += __expf(v[i] - m);
}

/// The block's log-sum-exp from each thread's (max, sum), for every thread.
__device__ __forceinline__ float blockLogSumExp(float m, float s) {
  for (int offset = 16; offset > 0; offset >>= 1)
    combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  __shared__ float sharedM[kThreads / 32], sharedS[kThreads / 32];
  __shared__ float lseShared;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sharedM[warp] = m;
    sharedS[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    m = lane < warps ? sharedM[lane] : -INFINITY;
    s = lane < warps ? sharedS[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1)
      combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    if (lane == 0)
      lseShared = m + logf(s);
  }
  __syncthreads();
  return lseShared;
}

/// One block per row. Packed: the row moves in Pack<T> groups (its width a
/// multiple of Pack<T>::kSize and 16-byte aligned); otherwise element by element.
template <typename T, bool Packed>
__global__ void softmaxCrossEntropyRows(T *__restrict__ logits, const int64_t *__restrict__ targets,
                                        float *__restrict__ loss, int64_t vocab, bool grad) {
  using P = Pack<T>;
  constexpr int kStep = Packed ? P::kSize : 1;
  const int64_t row = blockIdx.x;
  T *x = logits + row * vocab;
  float m = -INFINITY, s = 0.0f;
  const int64_t groups = vocab / kStep;
  int64_t g = threadIdx.x;
  if constexpr (Packed) {
    for (; g + blockDim.x < groups; g += 2 * blockDim.x) { // two 16-byte loads in flight
      const P a = P::load(x + g * kStep), b = P::load(x + (g + blockDim.x) * kStep);
      accumulate<P::kSize>(m, s, a.v);
      accumulate<P::kSize>(m, s, b.v);
    }
    for (; g < groups; g += blockDim.x)
      accumulate<P::kSize>(m, s, P::load(x + g * kStep).v);
  } else {
    for (; g < groups; g += blockDim.x) {
      const float v = static_cast<float>(x[g]);
      accumulate<1>(m, s, &v);
    }
  }
  const float lse = blockLogSumExp(m, s);
  const int64_t target = targets[row];
  // -100 is ignored; a target outside the vocabulary (the loader refuses such
  // tokens before they get here) is never read out of bounds.
  const bool valid = target != kIgnoreIndex && target >= 0 && target < vocab;
  if (threadIdx.x == 0)
    loss[row] = valid ? lse - static_cast<float>(x[target]) : 0.0f;
  if (!grad)
    return;
  __syncthreads(); // x[target] is read above before it is overwritten below
  for (g = threadIdx.x; g < groups; g += blockDim.x) {
    const int64_t first = g * kStep;
    if constexpr (Packed) {
      P p = P::load(x + first);
#pragma unroll
      for (int i = 0; i < P::kSize; ++i)
        p.v[i] = valid ? expf(p.v[i] - lse) - (first + i == target ? 1.0f : 0.0f) : 0.0f;
      p.store(x + first);
    } else {
      x[first] = static_cast<T>(valid ? expf(static_cast<float>(x[first]) - lse) - (first == target ? 1.0f : 0.0f)
                                      : 0.0f);
    }
  }
}

} // namespace

void softmaxCrossEntropyRowsInPlace(at::Tensor &logits, const at::Tensor &targets, at::Tensor &loss, bool grad) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous(),
              "softmaxCrossEntropyRowsInPlace: expected contiguous CUDA logits [rows, vocab]");
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.numel() == logits.size(0) && targets.is_contiguous(),
              "softmaxCrossEntropyRowsInPlace: expected one int64 target per row");
  TORCH_CHECK(loss.scalar_type() == at::kFloat && loss.numel() == logits.size(0),
              "softmaxCrossEntropyRowsInPlace: expected an fp32 loss per row");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0)
    return;
  c10::cuda::CUDAGuard guard(logits.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "softmaxCrossEntropyRows", [&] {
    scalar_t *x = logits.data_ptr<scalar_t>();
    if (packable<scalar_t>(vocab, {x}))
      softmaxCrossEntropyRows<scalar_t, true><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          x, targets.data_ptr<int64_t>(), loss.data_ptr<float>(), vocab, grad);
    else
      softmaxCrossEntropyRows<scalar_t, false><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          x, targets.data_ptr<int64_t>(), loss.data_ptr<float>(), vocab, grad);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace adapt::rt::cuda
