//===- DeltaRuleKernel.cu - the chunked gated delta rule's forward --------===//
//
// Three kernels (see DeltaRuleKernel.h): the per-chunk UT transform, the
// state recurrence over chunks, the per-chunk output. Tiles are bf16 in
// shared memory with rows padded by 8 elements (16 bytes), so the
// fragment loads of consecutive rows fall in different banks.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/DeltaRuleKernel.h"
#include "runtime/cuda/DeltaRule.cuh"
#include "runtime/cuda/DeltaRuleState.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace adapt::rt::cuda {

namespace {

using namespace delta;

/// Inclusive prefix sums of the chunk's 64 log decays (zero past \p valid)
/// into \p cum, by the first two warps; all threads synchronise.
__device__ __forceinline__ void chunkCumsum(float *cum, const float *decay, int valid) {
  __shared__ float firstHalf;
  const int tid = threadIdx.x, lane = tid % 32;
  float x = 0.0f;
  if (tid < kChunk) {
    x = tid < valid ? decay[tid] : 0.0f;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o)
        x += y;
    }
    if (tid == 31)
      firstHalf = x;
  }
  __syncthreads();
  if (tid < kChunk)
    cum[tid] = tid >= 32 ? x + firstHalf : x;
  __syncthreads();
}

/// Kernel 1, a block (256 threads) per (chunk, b·h): W and U of the chunk
/// ([64, 128] bf16 each) and its cumulative log decays.
__global__ void __launch_bounds__(256) deltaRuleTransformKernel(Strided key, Strided value, const float *decay,
                                                                const float *beta, int64_t tokens, bf16 *w, bf16 *u,
                                                                float *cumOut, bf16 *inverseOut, bool async,
                                                                int inverseForm, bool fold) {
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *ks = reinterpret_cast<bf16 *>(shared);      // k
  bf16 *vs = ks + kChunk * kRow;                     // v
  bf16 *ts = vs + kChunk * kRow;                     // T diag(beta exp(G)), then T diag(beta), bf16
  float *a = reinterpret_cast<float *>(ts + kChunk * kSquareRow); // A, then T in fp32 [64][65]
  float *cum = a + kChunk * (kChunk + 1);
  float *betas = cum + kChunk;
  const int64_t bh = blockIdx.y, row0 = int64_t(blockIdx.x) * kChunk;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  loadRows(ks, key, bh, row0, valid, async);
  loadRows(vs, value, bh, row0, valid, async);
  if (async) {
    asyncCommit();
    asyncWait<0>(); // chunkCumsum's barriers publish the tiles
  }
  if (tid < kChunk)
    betas[tid] = tid < valid ? beta[bh * tokens + row0 + tid] : 0.0f;
  chunkCumsum(cum, decay + bh * tokens + row0, valid);
  if (tid < kChunk)
    cumOut[bh * gridDim.x * kChunk + row0 + tid] = cum[tid];

  // A = strictly-lower(beta_i k_i.k_j exp(G_i - G_j)).
  {
    const int mt = warp % 4, half = warp / 4;
    float acc[4][4];
    zero(acc);
    productABt<4, kDim / 16>(acc, ks, kRow, ks, kRow, 16 * mt, 32 * half, g, t);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = 16 * mt + g + (i / 2) * 8, c = 32 * half + 8 * nt + 2 * t + i % 2;
        a[r * (kChunk + 1) + c] = c < r ? betas[r] * __expf(cum[r] - cum[c]) * acc[nt][i] : 0.0f;
      }
  }
  __syncthreads();
  // T = (I + A)^-1 in place of A's strictly lower part (ts is free until below).
  if (inverseForm)
    invertUnitLowerBlocked(a, reinterpret_cast<float *>(ts), tid, inverseForm == 2);
  else
    invertUnitLower(a, tid);
  // W = T diag(beta exp(G)) K and U = T diag(beta) V. With fold (the
  // default) the rows' factors go into T's columns (64 x 64 products, not 2
  // x 64 x 128): ts = T diag(beta exp(G)) for W, then T diag(beta) for U.
  // Without (ADAPT_DELTA_RULE_FOLD_FACTORS=0) ts = T, and k and v are scaled
  // in place. T itself (ones on the diagonal) goes to the backward in bf16
  // when asked.
  auto storeColumnScaledT = [&](bool forKeys) {
    for (int i = tid; i < kChunk * kChunk; i += blockDim.x) {
      const int r = i / kChunk, c = i % kChunk;
      const float x = c < r ? a[r * (kChunk + 1) + c] : c == r ? 1.0f : 0.0f;
      if (forKeys && inverseOut)
        inverseOut[(bh * gridDim.x * kChunk + row0 + r) * kChunk + c] = __float2bfloat16(x);
      const float factor = !fold ? 1.0f : forKeys ? betas[c] * __expf(cum[c]) : betas[c];
      ts[r * kSquareRow + c] = __float2bfloat16(x * factor);
    }
  };
  storeColumnScaledT(/*forKeys=*/true);
  if (!fold)
    for (int i = tid; i < kChunk * kDim; i += blockDim.x) {
      const int r = i / kDim, c = i % kDim;
      ks[r * kRow + c] = __float2bfloat16(__bfloat162float(ks[r * kRow + c]) * betas[r] * __expf(cum[r]));
      vs[r * kRow + c] = __float2bfloat16(__bfloat162float(vs[r * kRow + c]) * betas[r]);
    }
  __syncthreads();
  // A warp per 16 rows and 64 columns.
  const int mt = warp % 4, half = warp / 4;
  const int64_t rows0 = (bh * gridDim.x * kChunk + row0) * kDim;
  storeTransformed(w + rows0, ts, ks, mt, half, g, t, lane);
  if (fold) {
    __syncthreads(); // every warp has read T diag(beta exp(G))
    storeColumnScaledT(/*forKeys=*/false);
    __syncthreads();
  }
  storeTransformed(u + rows0, ts, vs, mt, half, g, t, lane);
}

/// Kernel 3, a block (256 threads) per (chunk, b·h): the chunk's output
/// rows, (q scale exp(G)) S_n + causal(q k^T scale exp(G_t - G_i)) V_new,
/// the first term's row factors scale exp(G) applied to q S_n in fp32.
__global__ void __launch_bounds__(256) deltaRuleOutputKernel(Strided query, Strided key, const bf16 *states,
                                                             const bf16 *newValues, const float *cum, int64_t tokens,
                                                             float scale, bf16 *out, bool async, bool fold) {
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *qs = reinterpret_cast<bf16 *>(shared);   // q (without fold: then q scale exp(G))
  bf16 *ks = qs + kChunk * kRow;
  bf16 *vs = ks + kChunk * kRow;                  // V_new
  bf16 *ss = vs + kChunk * kRow;                  // S_n [128][kRow]
  bf16 *ps = ss + kDim * kRow;                    // the causal scores [64][kSquareRow]
  float *cs = reinterpret_cast<float *>(ps + kChunk * kSquareRow);
  float *rowScale = cs + kChunk; // scale exp(G) per row
  const int chunks = gridDim.x;
  const int64_t bh = blockIdx.y, row0 = int64_t(blockIdx.x) * kChunk, padded = int64_t(chunks) * kChunk;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  loadRows(qs, query, bh, row0, valid, async);
  loadRows(ks, key, bh, row0, valid, async);
  const bf16 *state = states + (bh * chunks + blockIdx.x) * kDim * kDim;
  for (int i = tid; i < kDim * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    copy16(ss + r * kRow + c, state + r * kDim + c, true, async);
    if (r < kChunk)
      copy16(vs + r * kRow + c, newValues + (bh * padded + row0 + r) * kDim + c, true, async);
  }
  if (tid < kChunk) {
    cs[tid] = cum[bh * padded + row0 + tid];
    rowScale[tid] = scale * __expf(cs[tid]);
  }
  if (async) {
    asyncCommit();
    asyncWait<0>();
  }
  __syncthreads();
  const int mt = warp % 4, half = warp / 4;
  {
    float acc[4][4];
    zero(acc);
    productABt<4, kDim / 16>(acc, qs, kRow, ks, kRow, 16 * mt, 32 * half, g, t);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * mt + g + 8 * h, c = 32 * half + 8 * nt + 2 * t;
        const float p0 = c <= r ? acc[nt][2 * h] * scale * __expf(cs[r] - cs[c]) : 0.0f;
        const float p1 = c + 1 <= r ? acc[nt][2 * h + 1] * scale * __expf(cs[r] - cs[c + 1]) : 0.0f;
        *reinterpret_cast<uint32_t *>(ps + r * kSquareRow + c) = packBf16(p0, p1);
      }
  }
  __syncthreads(); // the scores are written (and read q, which !fold decays in place)
  if (!fold) {
    for (int i = tid; i < kChunk * kDim; i += blockDim.x) {
      const int r = i / kDim, c = i % kDim;
      qs[r * kRow + c] = __float2bfloat16(__bfloat162float(qs[r * kRow + c]) * rowScale[r]);
    }
    __syncthreads();
  }
  storeChunkOutput(out + (bh * tokens + row0) * kDim, qs, ss, ps, vs, valid, mt, half, g, t, lane,
                   fold ? rowScale : nullptr);
}

bool rowsPackable(const at::Tensor &x) {
  return x.stride(3) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 && x.stride(2) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

/// A forward's sizes over chunks of 64 and its output [B, H, T, 128]
/// (allocated); \p noTokens: nothing to compute (S_T, if asked, is then the
/// initial state, or zeros).
struct ForwardStart {
  int64_t batch, heads, tokens, bh, padded;
  int chunks;
  at::Tensor out;
  bool noTokens;
};

ForwardStart startForward(const char *name, const at::Tensor &key, const at::Tensor &initialState,
                          at::Tensor *finalState) {
  ForwardStart f;
  f.batch = key.size(0), f.heads = key.size(1), f.tokens = key.size(2), f.bh = f.batch * f.heads;
  f.out = at::empty({f.batch, f.heads, f.tokens, kDim}, key.options());
  f.noTokens = f.tokens == 0 || f.bh == 0;
  if (f.noTokens && finalState)
    *finalState = initialState.defined()
                      ? initialState.to(at::kFloat).clone()
                      : at::zeros({f.batch, f.heads, kDim, kDim}, key.options().dtype(at::kFloat));
  TORCH_CHECK(f.bh <= 65535, name, ": at most 65,535 batch x heads, got ", f.bh);
  f.chunks = static_cast<int>((f.tokens + kChunk - 1) / kChunk);
  f.padded = int64_t(f.chunks) * kChunk;
  return f;
}

/// The initial state as the state kernel reads it (fp32, contiguous), or
/// undefined (zeros) when none is given.
at::Tensor enteringState(const at::Tensor &initialState, int64_t bh) {
  if (!initialState.defined())
    return {};
  TORCH_CHECK(initialState.numel() == bh * kDim * kDim, "the delta rule kernels: expected an initial state [B, H, 128, 128]");
  return initialState.to(at::kFloat).contiguous();
}

/// Kernels 2 and 3 over \p chunks of 64: from W (undefined: W = 0, its
/// product skipped), U [B·H, n·64, 128] and the
/// cumulative log decays \p cum [B·H, n·64], each chunk's entering state
/// into \p states, V_new into \p vNew (without W, V_new = U: \p vNew is
/// then U itself, left as it is), the output [B, H, T, 128] into
/// \p out and, where \p last is defined, S_T into it. \p init (fp32) may
/// be undefined (zeros).
void stateAndOutput(const at::Tensor &query, const at::Tensor &key, const at::Tensor &w, const at::Tensor &u,
                    const at::Tensor &cum, const at::Tensor &init, float scale, at::Tensor &states, at::Tensor &vNew,
                    at::Tensor &last, at::Tensor &out) {
  const int64_t bh = key.size(0) * key.size(1), tokens = key.size(2);
  const int chunks = static_cast<int>(states.size(1));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool async = asyncLoads(), prefetch = async;
  const auto [columns, warps] = stateLaunch(bh);
  auto stateKernel = w.defined() ? stateKernelFor<false>(prefetch, columns, warps)
                                  : stateKernelFor<false, false>(prefetch, columns, warps);
  stateKernel<<<dim3(kDim / columns, bh), 32 * warps, stateKernelBytes(prefetch, columns), stream>>>(
      stridedRows(key), w.defined() ? bf16Data(w) : nullptr, bf16Data(u), cum.data_ptr<float>(), tokens, chunks,
      init.defined() ? init.data_ptr<float>() : nullptr, bf16Data(states), bf16Data(vNew),
      last.defined() ? last.data_ptr<float>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const size_t outputBytes = (3 * kChunk + kDim) * kRow * sizeof(bf16) + kChunk * kSquareRow * sizeof(bf16) +
                             2 * kChunk * sizeof(float);
  allowSharedMemory(deltaRuleOutputKernel, outputBytes);
  deltaRuleOutputKernel<<<dim3(chunks, bh), 256, outputBytes, stream>>>(
      stridedRows(query), stridedRows(key), bf16Data(states), bf16Data(vNew), cum.data_ptr<float>(), tokens, scale,
      bf16Data(out), async, foldFactors());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace

bool delta::asyncLoads() {
  static const bool on = !switchedOff("ADAPT_DELTA_RULE_PREFETCH");
  return on;
}

bool delta::blockInverse() {
  static const bool on = !switchedOff("ADAPT_DELTA_RULE_BLOCK_INVERSE");
  return on;
}

int delta::inverseForm() {
  static const int form = !blockInverse() ? 0 : switchedOn("ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS") ? 2 : 1;
  return form;
}

bool delta::foldFactors() {
  static const bool on = !switchedOff("ADAPT_DELTA_RULE_FOLD_FACTORS");
  return on;
}

bool delta::leanBackward() {
  static const bool on = !switchedOff("ADAPT_DELTA_RULE_LEAN_BACKWARD");
  return on;
}

namespace {
/// Whether a block per 32 value columns of \p heads sequences leaves each SM
/// one block or none (B·H x 4 <= the SM count).
bool gridUnderFilled(int64_t heads) {
  return heads * (kDim / 32) <= at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}
} // namespace

int delta::stateWarps(int64_t heads) {
  static const int forced = switchedChoice("ADAPT_DELTA_RULE_STATE_WARPS", {4, 8}, 0); // 0: unset, chosen here
  if (forced != 0)
    return forced;
  return gridUnderFilled(heads) ? 8 : 4;
}

int delta::stateColumns(int64_t heads) {
  static const int forced = switchedChoice("ADAPT_DELTA_RULE_STATE_COLUMNS", {16, 32}, 0); // 0: unset, chosen here
  if (forced != 0)
    return forced;
  return gridUnderFilled(heads) ? 16 : 32;
}

bool linearAttentionTakes(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value) {
  if (!query.is_cuda() || query.dim() != 4 || key.dim() != 4 || value.dim() != 4)
    return false;
  for (const at::Tensor *x : {&query, &key, &value})
    if (x->scalar_type() != at::kBFloat16 || x->size(3) != kDim || x->sizes().slice(0, 3) != key.sizes().slice(0, 3) ||
        !rowsPackable(*x) || x->device() != key.device())
      return false;
  return true;
}

bool deltaRuleForwardTakes(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                           const at::Tensor &decay, const at::Tensor &beta, int64_t chunkSize) {
  if (chunkSize != kChunk || !linearAttentionTakes(query, key, value))
    return false;
  return decay.dim() == 3 && decay.sizes() == key.sizes().slice(0, 3) && beta.sizes() == decay.sizes() &&
         at::isFloatingType(decay.scalar_type()) && at::isFloatingType(beta.scalar_type());
}

at::Tensor gatedDeltaRuleForward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                 const at::Tensor &decay, const at::Tensor &beta, const at::Tensor &initialState,
                                 at::Tensor *finalState, DeltaRuleSaved *saved) {
  TORCH_CHECK(deltaRuleForwardTakes(query, key, value, decay, beta, kChunk),
              "gatedDeltaRuleForward: expected bf16 [B, H, T, 128] query, key, value with packable rows and a "
              "[B, H, T] decay and beta");
  const c10::cuda::CUDAGuard guard(key.device());
  ForwardStart f = startForward("gatedDeltaRuleForward", key, initialState, finalState);
  if (f.noTokens)
    return f.out;
  const int64_t batch = f.batch, heads = f.heads, tokens = f.tokens, bh = f.bh, padded = f.padded;
  const int chunks = f.chunks;
  at::Tensor &out = f.out;
  const auto f32 = key.options().dtype(at::kFloat);
  at::Tensor g = decay.to(at::kFloat).contiguous(), b = beta.to(at::kFloat).contiguous();
  at::Tensor w = at::empty({bh, padded, kDim}, key.options()), u = at::empty_like(w), vNew = at::empty_like(w);
  at::Tensor cum = at::empty({bh, padded}, f32);
  at::Tensor states = at::empty({bh, chunks, kDim, kDim}, key.options());
  const at::Tensor init = enteringState(initialState, bh);
  at::Tensor last = finalState ? at::empty({batch, heads, kDim, kDim}, f32) : at::Tensor();
  at::Tensor inverse = saved ? at::empty({bh, padded, kChunk}, key.options()) : at::Tensor();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool async = asyncLoads();

  const size_t transformBytes = 2 * kChunk * kRow * sizeof(bf16) + kChunk * kSquareRow * sizeof(bf16) +
                                (kChunk * (kChunk + 1) + 2 * kChunk) * sizeof(float);
  allowSharedMemory(deltaRuleTransformKernel, transformBytes);
  deltaRuleTransformKernel<<<dim3(chunks, bh), 256, transformBytes, stream>>>(
      stridedRows(key), stridedRows(value), g.data_ptr<float>(), b.data_ptr<float>(), tokens,
      reinterpret_cast<bf16 *>(w.data_ptr<at::BFloat16>()), reinterpret_cast<bf16 *>(u.data_ptr<at::BFloat16>()),
      cum.data_ptr<float>(), inverse.defined() ? reinterpret_cast<bf16 *>(inverse.data_ptr<at::BFloat16>()) : nullptr,
      async, inverseForm(), foldFactors());
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  stateAndOutput(query, key, w, u, cum, init, static_cast<float>(1.0 / std::sqrt(double(kDim))), states, vNew, last,
                 out);
  if (finalState)
    *finalState = last;
  if (saved)
    *saved = {inverse, states, vNew, cum, w};
  return out;
}

at::Tensor decayedLinearAttentionForward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                         const at::Tensor &decay, float scale, const at::Tensor &initialState,
                                         at::Tensor *finalState, DeltaRuleSaved *saved) {
  TORCH_CHECK(deltaRuleForwardTakes(query, key, value, decay, decay, kChunk),
              "decayedLinearAttentionForward: expected bf16 [B, H, T, 128] query, key, value with packable rows and "
              "a [B, H, T] decay");
  const c10::cuda::CUDAGuard guard(key.device());
  ForwardStart f = startForward("decayedLinearAttentionForward", key, initialState, finalState);
  if (f.noTokens)
    return f.out;
  const int64_t batch = f.batch, heads = f.heads, tokens = f.tokens, bh = f.bh, padded = f.padded;
  const int chunks = f.chunks;
  at::Tensor &out = f.out;
  // G: the log decays' sums within each chunk (padding decays by 0, as the
  // transform kernel's chunkCumsum has it).
  at::Tensor g = decay.to(at::kFloat).reshape({bh, tokens});
  if (padded > tokens)
    g = at::constant_pad_nd(g, {0, padded - tokens});
  const at::Tensor cum = g.view({bh, chunks, kChunk}).cumsum(-1).view({bh, padded});
  // W = 0 (no tensor: the state kernels skip its products; measured on an
  // H100 in session 53, 3.89 -> 3.45 ms forward + backward at 64 heads x 8K
  // against multiplying by zeros) and U = V as the rows the state kernel
  // reads (zeros past the end).
  const at::Tensor w;
  at::Tensor u = value.is_contiguous() && padded == tokens ? value.view({bh, padded, kDim}) : at::Tensor();
  if (!u.defined()) { // one pass over v; only the padding is zeroed
    u = at::empty({batch, heads, padded, kDim}, key.options());
    u.narrow(2, 0, tokens).copy_(value);
    if (padded > tokens)
      u.narrow(2, tokens, padded - tokens).zero_();
    u = u.view({bh, padded, kDim});
  }
  at::Tensor states = at::empty({bh, chunks, kDim, kDim}, key.options());
  at::Tensor last = finalState ? at::empty({batch, heads, kDim, kDim}, key.options().dtype(at::kFloat)) : at::Tensor();
  stateAndOutput(query, key, w, u, cum, enteringState(initialState, bh), scale, states, u, last, out);
  if (finalState)
    *finalState = last;
  if (saved)
    *saved = {at::Tensor(), states, u, cum, at::Tensor()};
  return out;
}

} // namespace adapt::rt::cuda
