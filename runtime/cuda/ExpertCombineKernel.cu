//===- ExpertCombineKernel.cu - experts' rows back to tokens --------------===//
//
// Forward: one block per token reads its k rows and writes the weighted sum
// (the composition materialises the gathered [T*k, H] rows and runs a
// batched GEMM of k-long dot products, a shape cuBLAS handles badly).
// Backward: one block per token writes its k rows' gradients and reduces the
// k weights' dot products in the same pass (rows no pair owns are zeroed
// apart). Tokens to rows (the dispatch) is a gather of whole rows. Where the
// hidden width allows, every access moves 16 bytes (Packed.cuh); the
// element-at-a-time kernels remain for other widths.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/ExpertCombineKernel.h"
#include "runtime/cuda/Packed.cuh"
#include "runtime/cuda/Switches.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = 64;

/// Token \p t's k rows and weights (1 without weights) into the block's
/// shared \p src and \p w, visible to the whole block on return.
__device__ __forceinline__ void loadTokenPairs(const int64_t *__restrict__ rowOfPair,
                                               const float *__restrict__ weights, int64_t t, int k, int64_t *src,
                                               float *w) {
  if (threadIdx.x < k) {
    src[threadIdx.x] = rowOfPair[t * k + threadIdx.x];
    w[threadIdx.x] = weights ? weights[t * k + threadIdx.x] : 1.0f;
  }
  __syncthreads();
}

template <typename T>
__global__ void combineKernel(const T *__restrict__ rows, const int64_t *__restrict__ rowOfPair,
                              const float *__restrict__ weights, T *__restrict__ y, int64_t hidden, int k) {
  __shared__ int64_t src[kMaxK];
  __shared__ float w[kMaxK];
  const int64_t t = blockIdx.x;
  loadTokenPairs(rowOfPair, weights, t, k, src, w);
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      acc += w[j] * static_cast<float>(rows[src[j] * hidden + h]);
    y[t * hidden + h] = static_cast<T>(acc);
  }
}

/// The forward over 16-byte packs of the hidden width.
template <typename T>
__global__ void combinePackedKernel(const T *__restrict__ rows, const int64_t *__restrict__ rowOfPair,
                                    const float *__restrict__ weights, T *__restrict__ y, int64_t hidden, int k) {
  using P = Pack<T>;
  __shared__ int64_t src[kMaxK];
  __shared__ float w[kMaxK];
  const int64_t t = blockIdx.x;
  loadTokenPairs(rowOfPair, weights, t, k, src, w);
  for (int64_t h = threadIdx.x * int64_t(P::kSize); h < hidden; h += int64_t(blockDim.x) * P::kSize) {
    P acc;
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      acc.v[i] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const P x = P::load(rows + src[j] * hidden + h);
#pragma unroll
      for (int i = 0; i < P::kSize; ++i)
        acc.v[i] += w[j] * x.v[i];
    }
    acc.store(y + t * hidden + h);
  }
}

/// The whole backward in one pass over 16-byte packs: one block per token
/// reads its gradient once, writes each of its k rows' gradients (w_j g) and
/// reduces the k dot products g . x_j for the weights' gradient (when
/// \p gradW is not null). Rows no pair owns are zeroed by zeroUnownedRows.
/// The loops over the k slots run to the compile-time bound KMax >= k, so
/// the k running dot products stay in registers.
template <typename T, int KMax>
__global__ void combineBackwardPackedKernel(const T *__restrict__ gradY, const T *__restrict__ rows,
                                            const int64_t *__restrict__ rowOfPair, const float *__restrict__ weights,
                                            T *__restrict__ gradRows, float *__restrict__ gradW, int64_t hidden,
                                            int k) {
  using P = Pack<T>;
  __shared__ int64_t src[kMaxK];
  __shared__ float w[kMaxK];
  __shared__ float partial[kThreads / 32][kMaxK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < k) {
    src[threadIdx.x] = rowOfPair[t * k + threadIdx.x];
    w[threadIdx.x] = weights ? weights[t * k + threadIdx.x] : 1.0f;
  }
  __syncthreads();
  float dot[KMax];
#pragma unroll
  for (int j = 0; j < KMax; ++j)
    dot[j] = 0.0f;
  for (int64_t h = threadIdx.x * int64_t(P::kSize); h < hidden; h += int64_t(blockDim.x) * P::kSize) {
    const P g = P::load(gradY + t * hidden + h);
#pragma unroll
    for (int j = 0; j < KMax; ++j) {
      if (j >= k)
        break;
      P out;
#pragma unroll
      for (int i = 0; i < P::kSize; ++i)
        out.v[i] = w[j] * g.v[i];
      out.store(gradRows + src[j] * hidden + h);
      if (gradW) {
        const P x = P::load(rows + src[j] * hidden + h);
#pragma unroll
        for (int i = 0; i < P::kSize; ++i)
          dot[j] += g.v[i] * x.v[i];
      }
    }
  }
  if (!gradW)
    return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < KMax; ++j) {
    if (j >= k)
      break;
    float v = dot[j];
    for (int offset = 16; offset > 0; offset /= 2)
      v += __shfl_down_sync(0xffffffffu, v, offset);
    if (lane == 0)
      partial[warp][j] = v;
  }
  __syncthreads();
  if (threadIdx.x < k) {
    float sum = 0.0f;
    for (int i = 0; i < int(blockDim.x / 32); ++i)
      sum += partial[i][threadIdx.x];
    gradW[t * k + threadIdx.x] = sum;
  }
}

/// out[r] = tokens[tokenOfRow[r]] over 16-byte packs, one block per row.
template <typename T>
__global__ void gatherRowsPackedKernel(const T *__restrict__ tokens, const int64_t *__restrict__ tokenOfRow,
                                       T *__restrict__ out, int64_t hidden, int64_t outStride) {
  using P = Pack<T>;
  const int64_t r = blockIdx.x, src = tokenOfRow[r];
  for (int64_t h = threadIdx.x * int64_t(P::kSize); h < hidden; h += int64_t(blockDim.x) * P::kSize)
    *reinterpret_cast<uint4 *>(out + r * outStride + h) = *reinterpret_cast<const uint4 *>(tokens + src * hidden + h);
}

/// Zeroes the gradient rows that no (token, expert) pair owns: the padding
/// rows between experts' groups.
template <typename T>
__global__ void zeroUnownedRowsKernel(const int64_t *__restrict__ pairOfRow, T *__restrict__ gradRows,
                                      int64_t hidden) {
  const int64_t r = blockIdx.x;
  if (pairOfRow[r] >= 0)
    return;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
    gradRows[r * hidden + h] = static_cast<T>(0.0f);
}

template <typename T>
__global__ void gradRowsKernel(const T *__restrict__ gradY, const int64_t *__restrict__ pairOfRow,
                               const float *__restrict__ weights, T *__restrict__ gradRows, int64_t hidden, int k) {
  const int64_t r = blockIdx.x, p = pairOfRow[r];
  const float w = p < 0 ? 0.0f : (weights ? weights[p] : 1.0f);
  const T *g = p < 0 ? nullptr : gradY + (p / k) * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
    gradRows[r * hidden + h] = static_cast<T>(g ? w * static_cast<float>(g[h]) : 0.0f);
}

/// gradRowsKernel in 16-byte packs (hidden a whole number of packs).
template <typename T>
__global__ void gradRowsPackedKernel(const T *__restrict__ gradY, const int64_t *__restrict__ pairOfRow,
                                     const float *__restrict__ weights, T *__restrict__ gradRows, int64_t hidden,
                                     int k) {
  using P = Pack<T>;
  const int64_t r = blockIdx.x, p = pairOfRow[r];
  T *dst = gradRows + r * hidden;
  const T *src = p < 0 ? nullptr : gradY + (p / k) * hidden;
  const float w = p < 0 ? 0.0f : (weights ? weights[p] : 1.0f);
  for (int64_t h = threadIdx.x * int64_t(P::kSize); h < hidden; h += int64_t(blockDim.x) * P::kSize) {
    if (!src) {
      *reinterpret_cast<uint4 *>(dst + h) = make_uint4(0u, 0u, 0u, 0u);
    } else if (!weights) {
      *reinterpret_cast<uint4 *>(dst + h) = *reinterpret_cast<const uint4 *>(src + h);
    } else {
      P v = P::load(src + h);
#pragma unroll
      for (int i = 0; i < P::kSize; ++i)
        v.v[i] *= w;
      v.store(dst + h);
    }
  }
}

/// out[r] = sum_c a[r, c] * b[r, c] in fp32: one warp per row, 16-byte packs.
template <typename T>
__global__ void rowDotsPackedKernel(const T *__restrict__ a, const T *__restrict__ b, float *__restrict__ out,
                                    int64_t rows, int64_t width) {
  using P = Pack<T>;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows)
    return;
  float acc = 0.0f;
  for (int64_t c = int64_t(lane) * P::kSize; c < width; c += 32 * P::kSize) {
    const P x = P::load(a + row * width + c), y = P::load(b + row * width + c);
#pragma unroll
    for (int i = 0; i < P::kSize; ++i)
      acc += x.v[i] * y.v[i];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0)
    out[row] = acc;
}

template <typename T>
__global__ void gradWeightsKernel(const T *__restrict__ gradY, const T *__restrict__ rows,
                                  const int64_t *__restrict__ rowOfPair, float *__restrict__ gradW, int64_t pairs,
                                  int64_t hidden, int k) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= pairs)
    return;
  const T *g = gradY + (warp / k) * hidden, *x = rows + rowOfPair[warp] * hidden;
  float acc = 0.0f;
  for (int64_t h = lane; h < hidden; h += 32)
    acc += static_cast<float>(g[h]) * static_cast<float>(x[h]);
  for (int offset = 16; offset > 0; offset /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0)
    gradW[warp] = acc;
}

/// Whether combineRowsGradRows writes by token (one block per token reads
/// its gradient row once and stores it to its k rows, combineBackwardPackedKernel
/// without the weights' dots; padding rows zeroed apart) instead of by row
/// (gradRowsPackedKernel: one block per row, whose three dependent loads, the
/// row's pair, its weight, then the data, are most of its time: 169 us a
/// Qwen3-30B-A3B layer on an H100, ~55 % of the bandwidth, in session 39's
/// profile). ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN=1 (opt-in, written in session
/// 46 without a GPU; the `expert` op checks reach it).
bool gradRowsByToken() {
  static const bool on = switchedOn("ADAPT_EXPERT_GRAD_ROWS_BY_TOKEN");
  return on;
}

/// The k-bounded instance of combineBackwardPackedKernel for \p k, launched
/// a block per token: rows' gradients only where \p gradW is null.
template <typename T>
void launchCombineBackward(int64_t tokens, const T *gradY, const T *rows, const int64_t *rowOfPair,
                           const float *weights, T *gradRows, float *gradW, int64_t hidden, int64_t k) {
  auto launch = [&](auto kernel) {
    kernel<<<tokens, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(gradY, rows, rowOfPair, weights, gradRows,
                                                                      gradW, hidden, static_cast<int>(k));
  };
  if (k <= 8)
    launch(combineBackwardPackedKernel<T, 8>);
  else if (k <= 16)
    launch(combineBackwardPackedKernel<T, 16>);
  else
    launch(combineBackwardPackedKernel<T, kMaxK>);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/// Which pair of \p owner (rowOfPair) owns each of \p rows rows; -1 for
/// the padding between experts' groups.
at::Tensor pairOfRowFor(const at::Tensor &owner, int64_t rows) {
  return at::full({rows}, -1, owner.options()).index_copy_(0, owner, at::arange(owner.size(0), owner.options()));
}

/// Zeroes the rows of \p grad [rows, H] that no pair of \p owner writes
/// (none where every row has its pair).
void zeroUnownedRows(at::Tensor &grad, const at::Tensor &owner) {
  const int64_t rows = grad.size(0), hidden = grad.size(1);
  if (rows <= owner.size(0))
    return;
  const at::Tensor pairOfRow = pairOfRowFor(owner, rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "zeroUnownedRows", [&] {
    zeroUnownedRowsKernel<scalar_t><<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        pairOfRow.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(), hidden);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor weightsAsFloat(const at::Tensor &weights) {
  return weights.defined() ? weights.to(at::kFloat).contiguous() : at::Tensor();
}

} // namespace

at::Tensor combineRows(const at::Tensor &rows, const at::Tensor &rowOfPair, const at::Tensor &weights, int64_t k) {
  TORCH_CHECK(k > 0 && k <= kMaxK, "combineRows: k must be in [1, ", kMaxK, "]");
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t tokens = rowOfPair.size(0) / k, hidden = rows.size(1);
  at::Tensor y = at::empty({tokens, hidden}, rows.options());
  if (y.numel() == 0)
    return y;
  const at::Tensor w = weightsAsFloat(weights), in = rows.contiguous(), pairs = rowOfPair.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, rows.scalar_type(), "combineRows", [&] {
    const scalar_t *x = in.data_ptr<scalar_t>();
    scalar_t *out = y.data_ptr<scalar_t>();
    const float *wp = w.defined() ? w.data_ptr<float>() : nullptr;
    if (packable<scalar_t>(hidden, {x, out}))
      combinePackedKernel<scalar_t><<<tokens, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          x, pairs.data_ptr<int64_t>(), wp, out, hidden, static_cast<int>(k));
    else
      combineKernel<scalar_t><<<tokens, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          x, pairs.data_ptr<int64_t>(), wp, out, hidden, static_cast<int>(k));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

at::Tensor combineRowsGradRows(const at::Tensor &gradY, const at::Tensor &rowOfPair, const at::Tensor &weights,
                               int64_t k, int64_t rows) {
  const c10::cuda::CUDAGuard guard(gradY.device());
  const int64_t hidden = gradY.size(1);
  at::Tensor grad = at::empty({rows, hidden}, gradY.options());
  if (grad.numel() == 0)
    return grad;
  const at::Tensor w = weightsAsFloat(weights), g = gradY.contiguous(), owner = rowOfPair.contiguous();
  const bool packed = AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "gradRowsPackable", [&] {
    return packable<scalar_t>(hidden, {g.data_ptr(), grad.data_ptr()});
  });
  if (packed && gradRowsByToken() && k <= kMaxK && owner.size(0) == g.size(0) * k) { // by token, padding apart
    zeroUnownedRows(grad, owner);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "combineRowsGradRowsByToken", [&] {
      launchCombineBackward<scalar_t>(owner.size(0) / k, g.data_ptr<scalar_t>(), nullptr, owner.data_ptr<int64_t>(),
                                      w.defined() ? w.data_ptr<float>() : nullptr, grad.data_ptr<scalar_t>(), nullptr,
                                      hidden, k);
    });
    return grad;
  }
  // By row: which pair owns each row (-1: padding), so every row is written once.
  const at::Tensor pairOfRow = pairOfRowFor(owner, rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gradY.scalar_type(), "combineRowsGradRows", [&] {
    const float *wp = w.defined() ? w.data_ptr<float>() : nullptr;
    if (packed)
      gradRowsPackedKernel<scalar_t><<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          g.data_ptr<scalar_t>(), pairOfRow.data_ptr<int64_t>(), wp, grad.data_ptr<scalar_t>(), hidden,
          static_cast<int>(k));
    else
      gradRowsKernel<scalar_t><<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          g.data_ptr<scalar_t>(), pairOfRow.data_ptr<int64_t>(), wp, grad.data_ptr<scalar_t>(), hidden,
          static_cast<int>(k));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

at::Tensor combineRowsGradWeights(const at::Tensor &gradY, const at::Tensor &rows, const at::Tensor &rowOfPair,
                                  int64_t k, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(gradY.device());
  const int64_t pairs = rowOfPair.size(0), hidden = gradY.size(1);
  at::Tensor gradW = at::empty({pairs / k, k}, gradY.options().dtype(at::kFloat));
  if (pairs == 0)
    return gradW.to(dtype);
  const at::Tensor g = gradY.contiguous(), in = rows.contiguous(), owner = rowOfPair.contiguous();
  const int64_t blocks = (pairs * 32 + kThreads - 1) / kThreads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gradY.scalar_type(), "combineRowsGradWeights", [&] {
    gradWeightsKernel<scalar_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        g.data_ptr<scalar_t>(), in.data_ptr<scalar_t>(), owner.data_ptr<int64_t>(), gradW.data_ptr<float>(), pairs,
        hidden, static_cast<int>(k));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return gradW.to(dtype);
}

std::pair<at::Tensor, at::Tensor> combineRowsBackward(const at::Tensor &gradY, const at::Tensor &rows,
                                                      const at::Tensor &rowOfPair, const at::Tensor &weights,
                                                      int64_t k, bool needWeights) {
  TORCH_CHECK(k > 0 && k <= kMaxK, "combineRowsBackward: k must be in [1, ", kMaxK, "]");
  const c10::cuda::CUDAGuard guard(gradY.device());
  const int64_t hidden = gradY.size(1), pairs = rowOfPair.size(0), tokens = pairs / k;
  const at::Tensor g = gradY.contiguous(), in = rows.contiguous(), owner = rowOfPair.contiguous();
  at::Tensor gradRows = at::empty({in.size(0), hidden}, g.options());
  const bool packed = AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "combinePackable", [&] {
    return packable<scalar_t>(hidden, {g.data_ptr(), in.data_ptr(), gradRows.data_ptr()});
  });
  if (!packed || gradRows.numel() == 0 || tokens == 0) {
    at::Tensor gradW = needWeights ? combineRowsGradWeights(g, in, owner, k, weights.scalar_type()) : at::Tensor();
    return {combineRowsGradRows(g, owner, weights, k, in.size(0)), gradW};
  }
  zeroUnownedRows(gradRows, owner);
  const at::Tensor w = weightsAsFloat(weights);
  at::Tensor gradW = needWeights ? at::empty({tokens, k}, g.options().dtype(at::kFloat)) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "combineRowsBackward", [&] {
    launchCombineBackward<scalar_t>(tokens, g.data_ptr<scalar_t>(), in.data_ptr<scalar_t>(), owner.data_ptr<int64_t>(),
                                    w.defined() ? w.data_ptr<float>() : nullptr, gradRows.data_ptr<scalar_t>(),
                                    needWeights ? gradW.data_ptr<float>() : nullptr, hidden, k);
  });
  return {gradRows, needWeights ? gradW.to(weights.scalar_type()) : at::Tensor()};
}

bool gatherRowsInto(const at::Tensor &tokens, const at::Tensor &tokenOfRow, at::Tensor out) {
  const c10::cuda::CUDAGuard guard(tokens.device());
  const at::Tensor in = tokens.contiguous(), index = tokenOfRow.contiguous();
  const int64_t hidden = in.size(1), rows = index.size(0);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.size(1) == hidden && out.stride(1) == 1 &&
                  out.scalar_type() == in.scalar_type(),
              "gatherRows: expected a [rows, hidden] output of the tokens' dtype with unit column stride");
  const int64_t outStride = out.stride(0);
  const bool packed = AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "gatherPackable", [&] {
    return packable<scalar_t>(hidden, {in.data_ptr(), out.data_ptr()}) && outStride % Pack<scalar_t>::kSize == 0;
  });
  if (!packed)
    return false;
  if (out.numel() == 0)
    return true;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "gatherRows", [&] {
    gatherRowsPackedKernel<scalar_t><<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), hidden, outStride);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

at::Tensor gatherRows(const at::Tensor &tokens, const at::Tensor &tokenOfRow) {
  at::Tensor out = at::empty({tokenOfRow.size(0), tokens.size(1)}, tokens.options());
  if (!gatherRowsInto(tokens, tokenOfRow, out))
    return tokens.index_select(0, tokenOfRow);
  return out;
}

at::Tensor rowDots(const at::Tensor &a, const at::Tensor &b) {
  if (a.dim() != 2 || a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() || !a.is_contiguous() ||
      !b.is_contiguous())
    return {};
  const int64_t rows = a.size(0), width = a.size(1);
  const bool packed = AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "rowDotsPackable", [&] {
    return packable<scalar_t>(width, {a.data_ptr(), b.data_ptr()});
  });
  if (!packed)
    return {};
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty({rows}, a.options().dtype(at::kFloat));
  if (rows == 0)
    return out;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "rowDots", [&] {
    rowDotsPackedKernel<scalar_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), out.data_ptr<float>(), rows, width);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

} // namespace adapt::rt::cuda
