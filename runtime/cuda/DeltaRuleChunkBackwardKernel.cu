//===- DeltaRuleChunkBackwardKernel.cu - the delta rule's whole backward --===//
//
// The chunked gated delta rule's backward on the GPU, fla's decomposition
// (runtime/DeltaRuleFunction.cpp holds the same algebra in LibTorch, the
// reference). Four kernels, all with bf16 tiles and fp32 accumulation:
//   1. per chunk: Kd = k e^{G_last - G}, Qd = q scale e^G, dO padded to
//      chunks, and P^T dO with P = causal(q k^T scale e^{G_t - G_i});
//   2. the state gradient over the chunks, last to first
//      (DeltaRuleBackwardKernel.cu): dS' of each chunk and dV_new;
//   3. per chunk, through the state and the scores: dq (final), dk's part
//      from O and S' (fp32), dW = -dV_new S^T, and dG's part;
//   4. per chunk, through the UT transform (W = T Xk, U = T Xv, T = (I +
//      A)^-1): dk (final), dv, dbeta, and dg as the reverse cumulative sum
//      of dG within the chunk.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/DeltaRule.cuh"
#include "runtime/cuda/DeltaRuleKernel.h"
#include "runtime/cuda/Switches.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <type_traits>

namespace adapt::rt::cuda {

namespace {

using namespace delta;

/// This thread's share of sum(dS' . S) over a chunk's [128, 128] state (S
/// in the bf16 tile \p ss), dS' kept in fp32: with \p async its 16 loads in
/// flight together (the code the H100 checks ran, kept as it was).
__device__ __forceinline__ float stateGradDotState(const float *stateGrad, const bf16 *ss, bool async) {
  float x = 0.0f;
  auto add = [&](const float4 &d, int i) {
    const bf16 *s = ss + (4 * i / kDim) * kRow + (4 * i) % kDim;
    x += d.x * __bfloat162float(s[0]) + d.y * __bfloat162float(s[1]) + d.z * __bfloat162float(s[2]) +
         d.w * __bfloat162float(s[3]);
  };
  if (async) {
    float4 d[kDim * kDim / 4 / 256];
#pragma unroll
    for (int j = 0; j < kDim * kDim / 4 / 256; ++j)
      d[j] = *reinterpret_cast<const float4 *>(stateGrad + 4 * (threadIdx.x + 256 * j));
#pragma unroll
    for (int j = 0; j < kDim * kDim / 4 / 256; ++j)
      add(d[j], threadIdx.x + 256 * j);
  } else {
    for (int i = threadIdx.x; i < kDim * kDim / 4; i += blockDim.x)
      add(*reinterpret_cast<const float4 *>(stateGrad + 4 * i), i);
  }
  return x;
}

/// The same with dS' kept in bf16 (leanBackward()): eight values a 16-byte
/// load, the thread's 8 loads in flight together.
__device__ __forceinline__ float stateGradDotState(const bf16 *stateGrad, const bf16 *ss, bool) {
  constexpr int kLoads = kDim * kDim / 8 / 256;
  uint4 d[kLoads];
#pragma unroll
  for (int j = 0; j < kLoads; ++j)
    d[j] = *reinterpret_cast<const uint4 *>(stateGrad + 8 * (threadIdx.x + 256 * j));
  float x = 0.0f;
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = 8 * (threadIdx.x + 256 * j);
    const __nv_bfloat162 *pairs = reinterpret_cast<const __nv_bfloat162 *>(&d[j]);
    const __nv_bfloat162 *state = reinterpret_cast<const __nv_bfloat162 *>(ss + (i / kDim) * kRow + i % kDim);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = __bfloat1622float2(pairs[e]), b = __bfloat1622float2(state[e]);
      x += a.x * b.x + a.y * b.y;
    }
  }
  return x;
}

/// Kernel 1, a block (256 threads) per (chunk, b·h): Kd, Qd and dO as
/// contiguous rows [B·H, n·64, 128] (bf16; dO only where \p gradOutRows is
/// given) and localNew = P^T dO (fp32).
__global__ void __launch_bounds__(256)
    deltaRuleLocalKernel(Strided query, Strided key, Strided gradOut, const float *cum, int64_t tokens, float scale,
                         bf16 *keysToEnd, bf16 *queryDecayed, bf16 *gradOutRows, float *localNew, bool async) {
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *qs = reinterpret_cast<bf16 *>(shared);
  bf16 *ks = qs + kChunk * kRow;
  bf16 *dos = ks + kChunk * kRow;
  bf16 *pts = dos + kChunk * kRow; // P^T [64][kSquareRow]
  float *cs = reinterpret_cast<float *>(pts + kChunk * kSquareRow);
  const int64_t bh = blockIdx.y, row0 = int64_t(blockIdx.x) * kChunk, padded = int64_t(gridDim.x) * kChunk;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  loadRows(qs, query, bh, row0, valid, async);
  loadRows(ks, key, bh, row0, valid, async);
  loadRows(dos, gradOut, bh, row0, valid, async);
  if (tid < kChunk)
    cs[tid] = cum[bh * padded + row0 + tid];
  awaitCopies(async);
  __syncthreads();
  const int mt = warp % 4, half = warp / 4;
  {
    float acc[4][4];
    zero(acc);
    productABt<4, kDim / 16>(acc, ks, kRow, qs, kRow, 16 * mt, 32 * half, g, t); // k_i . q_t
    forTile<4>(16 * mt, 32 * half, g, t, [&](int nt, int i, int r, int c) {
      pts[r * kSquareRow + c] = __float2bfloat16(c >= r ? acc[nt][i] * scale * __expf(cs[c] - cs[r]) : 0.0f);
    });
  }
  const int64_t out0 = (bh * padded + row0) * kDim;
  const float last = cs[kChunk - 1];
  for (int i = tid; i < kChunk * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    const float toEnd = __expf(last - cs[r]), gamma = scale * __expf(cs[r]);
    uint32_t kd[4], qd[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      kd[j] = packBf16(__bfloat162float(ks[r * kRow + c + 2 * j]) * toEnd,
                       __bfloat162float(ks[r * kRow + c + 2 * j + 1]) * toEnd);
      qd[j] = packBf16(__bfloat162float(qs[r * kRow + c + 2 * j]) * gamma,
                       __bfloat162float(qs[r * kRow + c + 2 * j + 1]) * gamma);
    }
    *reinterpret_cast<uint4 *>(keysToEnd + out0 + r * kDim + c) = make_uint4(kd[0], kd[1], kd[2], kd[3]);
    *reinterpret_cast<uint4 *>(queryDecayed + out0 + r * kDim + c) = make_uint4(qd[0], qd[1], qd[2], qd[3]);
    if (gradOutRows != nullptr)
      *reinterpret_cast<uint4 *>(gradOutRows + out0 + r * kDim + c) = *reinterpret_cast<const uint4 *>(dos + r * kRow + c);
  }
  __syncthreads();
  float acc[8][4];
  zero(acc);
  productAB<8, kChunk / 16>(acc, pts, kSquareRow, dos, kRow, 16 * mt, 64 * half, g, t, lane);
  forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
    *reinterpret_cast<float2 *>(localNew + out0 + r * kDim + c) = make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
  });
}

/// Adds a warp's row sums (\p rowPart[h] for row m0 + g + 8 h) to \p sums.
__device__ __forceinline__ void addRowSums(float *sums, const float (&rowPart)[2], int m0, int g, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float x = rowLanesSum(rowPart[h]);
    if (t == 0)
      atomicAdd(sums + m0 + g + 8 * h, x);
  }
}

/// Subtracts a warp's column sums (\p columnPart[nt][j] for column n0 + 8 nt
/// + 2 t + j, over its 16 rows) from \p sums.
__device__ __forceinline__ void subtractColumnSums(float *sums, const float (&columnPart)[4][2], int n0, int g,
                                                   int t) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float x = columnLanesSum(columnPart[nt][j]);
      if (g == 0)
        atomicAdd(sums + n0 + 8 * nt + 2 * t + j, -x);
    }
}

/// Kernel 3, a block (256 threads) per (chunk, b·h), after the state
/// gradient: dq (bf16 [B, H, T, 128]), dk's part through O and S' (fp32
/// rows), dW = -dV_new S^T (bf16 rows), and the part of dG [B·H, n·64]
/// from the scores, Qd, Kd and the chunk's last decay. dV_new and dS' come
/// as \p Grad (fp32, or bf16 under leanBackward()). \p gradW null: W = 0,
/// no dW. Without \p DeltaRule (linear attention with a fixed decay: W = 0,
/// U = V, no decay gradient wanted) dk's part is the whole dk, written as
/// bf16 [B, H, T, 128] to \p gradKeyData, and the scores q k^T, the dG sums
/// and \p gradCumPart (null) are skipped.
template <typename Grad, bool DeltaRule = true>
__global__ void __launch_bounds__(256)
    deltaRuleChunkGradKernel(Strided query, Strided key, const bf16 *gradOutRows, const bf16 *newValues,
                             const void *gradNewData, const bf16 *states, const void *leavingData, const float *cum,
                             int64_t tokens, float scale, bf16 *gradQuery, void *gradKeyData, bf16 *gradW,
                             float *gradCumPart, bool async) {
  const Grad *gradNew = static_cast<const Grad *>(gradNewData), *leaving = static_cast<const Grad *>(leavingData);
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *qs = reinterpret_cast<bf16 *>(shared);
  bf16 *ks = qs + kChunk * kRow;
  bf16 *dos = ks + kChunk * kRow;
  bf16 *vns = dos + kChunk * kRow; // V_new
  bf16 *dns = vns + kChunk * kRow; // dV_new
  bf16 *ss = dns + kChunk * kRow;  // S [128][kRow], then dS'
  bf16 *sd = ss + kDim * kRow;     // scale (dO V_new^T . D) [64][kSquareRow]
  float *cs = reinterpret_cast<float *>(sd + kChunk * kSquareRow);
  float *dc = cs + kChunk;
  float *sums = dc + kChunk; // {sum dS' . S, sum of Kd . dKd}
  const int chunks = gridDim.x;
  const int64_t bh = blockIdx.y, n = blockIdx.x, row0 = n * kChunk, padded = int64_t(chunks) * kChunk;
  const int64_t rows0 = bh * padded + row0;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int mt = warp % 4, half = warp / 4;
  const bf16 *state = states + (bh * chunks + n) * kDim * kDim;
  const Grad *stateGrad = leaving + (bh * chunks + n) * kDim * kDim;
  loadRows(qs, query, bh, row0, valid, async);
  loadRows(ks, key, bh, row0, valid, async);
  loadBf16(dos, kRow, gradOutRows + rows0 * kDim, kChunk, async);
  loadBf16(vns, kRow, newValues + rows0 * kDim, kChunk, async);
  loadBf16(ss, kRow, state, kDim, async);
  loadGrad<kChunk>(dns, kRow, gradNew + rows0 * kDim, async);
  if (tid < kChunk) {
    cs[tid] = cum[rows0 + tid];
    dc[tid] = 0.0f;
  }
  if (tid < 2)
    sums[tid] = 0.0f;
  awaitCopies(async);
  __syncthreads();
  if constexpr (DeltaRule) { // sum(dS' . S), for the chunk's last decay
    float x = stateGradDotState(stateGrad, ss, async);
    x = rowLanesSum(x);
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 16);
    if (lane == 0)
      atomicAdd(sums, x);
  }
  // dScores = dO V_new^T (causal) and the scores q k^T scale D: sd, and
  // dG += rowsum - columnsum of dScores . scores.
  {
    float dsc[4][4], sco[4][4];
    zero(dsc);
    zero(sco);
    productABt<4, kDim / 16>(dsc, dos, kRow, vns, kRow, 16 * mt, 32 * half, g, t);
    if constexpr (DeltaRule)
      productABt<4, kDim / 16>(sco, qs, kRow, ks, kRow, 16 * mt, 32 * half, g, t);
    float rowPart[2] = {0.0f, 0.0f}, columnPart[4][2] = {};
    forTile<4>(16 * mt, 32 * half, g, t, [&](int nt, int i, int r, int c) {
      const float d = c <= r ? __expf(cs[r] - cs[c]) : 0.0f;
      sd[r * kSquareRow + c] = __float2bfloat16(dsc[nt][i] * d * scale);
      if constexpr (DeltaRule) {
        const float p = dsc[nt][i] * sco[nt][i] * scale * d;
        rowPart[i / 2] += p;
        columnPart[nt][i % 2] += p;
      }
    });
    if constexpr (DeltaRule) {
      addRowSums(dc, rowPart, 16 * mt, g, t);
      subtractColumnSums(dc, columnPart, 32 * half, g, t);
    }
  }
  // dQd = dO S^T: dq = scale e^G dQd (+ the scores' part below); dG += Qd . dQd.
  float dq[8][4];
  zero(dq);
  productABt<8, kDim / 16>(dq, dos, kRow, ss, kRow, 16 * mt, 64 * half, g, t);
  {
    float rowPart[2] = {0.0f, 0.0f};
    forTile<8>(16 * mt, 64 * half, g, t, [&](int nt, int i, int r, int c) {
      const float gamma = scale * __expf(cs[r]);
      dq[nt][i] *= gamma;
      if constexpr (DeltaRule)
        rowPart[i / 2] += dq[nt][i] * __bfloat162float(qs[r * kRow + c]);
    });
    if constexpr (DeltaRule)
      addRowSums(dc, rowPart, 16 * mt, g, t);
  }
  if (DeltaRule && gradW != nullptr) { // dW = -dV_new S^T (none when W = 0)
    float dw[8][4];
    zero(dw);
    productABt<8, kDim / 16>(dw, dns, kRow, ss, kRow, 16 * mt, 64 * half, g, t);
    forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
      *reinterpret_cast<uint32_t *>(gradW + (rows0 + r) * kDim + c) =
          packBf16(-dw[nt][2 * h], -dw[nt][2 * h + 1]);
    });
  }
  __syncthreads(); // S and sd's writers are done
  loadGrad<kDim>(ss, kRow, stateGrad, async);
  // dq += sd K, out.
  productAB<8, kChunk / 16>(dq, sd, kSquareRow, ks, kRow, 16 * mt, 64 * half, g, t, lane);
  forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
    if (r < valid)
      *reinterpret_cast<uint32_t *>(gradQuery + (bh * tokens + row0 + r) * kDim + c) =
          packBf16(dq[nt][2 * h], dq[nt][2 * h + 1]);
  });
  if constexpr (std::is_same_v<Grad, bf16>) // its dS' came by cp.async
    awaitCopies(async);
  __syncthreads(); // dS' in place
  // dKd = V_new dS'^T: dk = e^{G_last - G} dKd + sd^T q; dG -= Kd . dKd,
  // and the chunk's last dG gets their sum.
  float dk[8][4];
  zero(dk);
  productABt<8, kDim / 16>(dk, vns, kRow, ss, kRow, 16 * mt, 64 * half, g, t);
  {
    const float last = cs[kChunk - 1];
    float rowPart[2] = {0.0f, 0.0f};
    forTile<8>(16 * mt, 64 * half, g, t, [&](int nt, int i, int r, int c) {
      dk[nt][i] *= __expf(last - cs[r]);
      if constexpr (DeltaRule)
        rowPart[i / 2] += dk[nt][i] * __bfloat162float(ks[r * kRow + c]);
    });
    if constexpr (DeltaRule) {
      float total = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float x = rowLanesSum(rowPart[h]);
        if (t == 0) {
          atomicAdd(dc + 16 * mt + g + 8 * h, -x);
          total += x;
        }
      }
      if (t == 0)
        atomicAdd(sums + 1, total);
    }
  }
  productAtB<8, kChunk / 16>(dk, sd, kSquareRow, qs, kRow, 16 * mt, 64 * half, lane);
  if constexpr (DeltaRule) {
    float *gradKeyPart = static_cast<float *>(gradKeyData);
    forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
      *reinterpret_cast<float2 *>(gradKeyPart + (rows0 + r) * kDim + c) = make_float2(dk[nt][2 * h], dk[nt][2 * h + 1]);
    });
  } else { // the whole dk, as dq is written
    bf16 *gradKey = static_cast<bf16 *>(gradKeyData);
    forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
      if (r < valid)
        *reinterpret_cast<uint32_t *>(gradKey + (bh * tokens + row0 + r) * kDim + c) =
            packBf16(dk[nt][2 * h], dk[nt][2 * h + 1]);
    });
    return;
  }
  __syncthreads();
  if (tid < kChunk)
    gradCumPart[rows0 + tid] =
        dc[tid] + (tid == kChunk - 1 ? sums[1] + sums[0] * __expf(cs[kChunk - 1]) : 0.0f);
}

/// Kernel 4, a block (256 threads) per (chunk, b·h): the gradients through
/// W = T Xk and U = T Xv (Xk = k beta e^G, Xv = v beta) and T = (I + A)^-1
/// with A = strictly-lower(beta_t k_t.k_i e^{G_t - G_i}): dk (bf16, with
/// kernel 3's part), dv (bf16), dbeta and dg (fp32 [B·H, T]). dV_new comes
/// as \p Grad. With \p ScaledInEpilogue (the default since
/// session 44's checks; ADAPT_DELTA_RULE_TWO_BLOCKS=0 opts out) dT = (dW K^T) diag(beta e^G) +
/// (dU V^T) diag(beta) takes its column scales in the epilogue, so the Xk
/// and Xv tiles and their pass are gone: 96 KiB of shared memory instead of
/// 130, two blocks per SM instead of one (the kernel was 2.6 ms of 12.4 at
/// 1 x 32 heads x 32K on the H200, latency-bound at 8 warps per SM).
template <typename Grad, bool ScaledInEpilogue>
__global__ void __launch_bounds__(256)
    deltaRuleTransformGradKernel(Strided key, Strided value, const float *beta, const float *cum, const bf16 *inverse,
                                 const bf16 *gradW, const void *gradNewData, const float *gradKeyPart,
                                 const float *gradCumPart, int64_t tokens, bf16 *gradKey, bf16 *gradValue,
                                 float *gradBeta, float *gradDecay, bool async) {
  const Grad *gradNew = static_cast<const Grad *>(gradNewData);
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *ks = reinterpret_cast<bf16 *>(shared);
  bf16 *vs = ks + kChunk * kRow;
  constexpr int kScaledTiles = ScaledInEpilogue ? 0 : 2;
  bf16 *xks = vs + kChunk * kRow;  // k beta e^G (not with ScaledInEpilogue)
  bf16 *xvs = xks + kChunk * kRow; // v beta (likewise)
  bf16 *dws = vs + (1 + kScaledTiles) * kChunk * kRow; // dW
  bf16 *dns = dws + kChunk * kRow; // dV_new = dU
  bf16 *ts = dns + kChunk * kRow;  // T [64][kSquareRow]
  bf16 *sq1 = ts + kChunk * kSquareRow; // dT, then dA . beta D
  bf16 *sq2 = sq1 + kChunk * kSquareRow; // T^T dT
  float *cs = reinterpret_cast<float *>(sq2 + kChunk * kSquareRow);
  float *bs = cs + kChunk, *dc = bs + kChunk, *db = dc + kChunk;
  const int64_t bh = blockIdx.y, row0 = int64_t(blockIdx.x) * kChunk, padded = int64_t(gridDim.x) * kChunk;
  const int64_t rows0 = bh * padded + row0;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int mt = warp % 4, half = warp / 4;
  loadRows(ks, key, bh, row0, valid, async);
  loadRows(vs, value, bh, row0, valid, async);
  loadBf16(dws, kRow, gradW + rows0 * kDim, kChunk, async);
  loadGrad<kChunk>(dns, kRow, gradNew + rows0 * kDim, async);
  loadBf16<kChunk>(ts, kSquareRow, inverse + rows0 * kChunk, kChunk, async);
  if (tid < kChunk) {
    cs[tid] = cum[rows0 + tid];
    bs[tid] = tid < valid ? beta[bh * tokens + row0 + tid] : 0.0f;
    dc[tid] = gradCumPart[rows0 + tid];
    db[tid] = 0.0f;
  }
  awaitCopies(async);
  __syncthreads();
  if constexpr (ScaledInEpilogue) { // dT = (dW K^T) diag(beta e^G) + (dU V^T) diag(beta)
    float acc[4][4], accValues[4][4];
    zero(acc);
    zero(accValues);
    productABt<4, kDim / 16>(acc, dws, kRow, ks, kRow, 16 * mt, 32 * half, g, t);
    productABt<4, kDim / 16>(accValues, dns, kRow, vs, kRow, 16 * mt, 32 * half, g, t);
    forTile<4>(16 * mt, 32 * half, g, t, [&](int nt, int i, int r, int c) {
      sq1[r * kSquareRow + c] = __float2bfloat16(bs[c] * (acc[nt][i] * __expf(cs[c]) + accValues[nt][i]));
    });
  } else {
    for (int i = tid; i < kChunk * kDim; i += blockDim.x) {
      const int r = i / kDim, c = i % kDim;
      xks[r * kRow + c] = __float2bfloat16(__bfloat162float(ks[r * kRow + c]) * bs[r] * __expf(cs[r]));
      xvs[r * kRow + c] = __float2bfloat16(__bfloat162float(vs[r * kRow + c]) * bs[r]);
    }
    __syncthreads();
    // dT = dW Xk^T + dU Xv^T
    float acc[4][4];
    zero(acc);
    productABt<4, kDim / 16>(acc, dws, kRow, xks, kRow, 16 * mt, 32 * half, g, t);
    productABt<4, kDim / 16>(acc, dns, kRow, xvs, kRow, 16 * mt, 32 * half, g, t);
    forTile<4>(16 * mt, 32 * half, g, t,
               [&](int nt, int i, int r, int c) { sq1[r * kSquareRow + c] = __float2bfloat16(acc[nt][i]); });
  }
  __syncthreads();
  { // T^T dT
    float acc[4][4];
    zero(acc);
    productAtB<4, kChunk / 16>(acc, ts, kSquareRow, sq1, kSquareRow, 16 * mt, 32 * half, lane);
    forTile<4>(16 * mt, 32 * half, g, t,
               [&](int nt, int i, int r, int c) { sq2[r * kSquareRow + c] = __float2bfloat16(acc[nt][i]); });
  }
  __syncthreads();
  { // dA = -(T^T dT T^T) strictly lower; the key products K K^T . D.
    float da[4][4], kk[4][4];
    zero(da);
    zero(kk);
    productABt<4, kChunk / 16>(da, sq2, kSquareRow, ts, kSquareRow, 16 * mt, 32 * half, g, t);
    productABt<4, kDim / 16>(kk, ks, kRow, ks, kRow, 16 * mt, 32 * half, g, t);
    float rowPart[2] = {0.0f, 0.0f}, rowBeta[2] = {0.0f, 0.0f}, columnPart[4][2] = {};
    forTile<4>(16 * mt, 32 * half, g, t, [&](int nt, int i, int r, int c) {
      const float d = c < r ? __expf(cs[r] - cs[c]) : 0.0f;
      const float a = -da[nt][i], p = a * kk[nt][i] * d; // dA . (K K^T . D)
      sq1[r * kSquareRow + c] = __float2bfloat16(a * bs[r] * d);
      rowPart[i / 2] += p;
      rowBeta[i / 2] += p * bs[r];
      columnPart[nt][i % 2] += p * bs[r];
    });
    addRowSums(db, rowPart, 16 * mt, g, t);
    addRowSums(dc, rowBeta, 16 * mt, g, t);
    subtractColumnSums(dc, columnPart, 32 * half, g, t);
  }
  __syncthreads();
  { // dXk = T^T dW: dk = beta e^G dXk + dA' K + dA'^T K + kernel 3's part.
    float dk[8][4];
    zero(dk);
    productAtB<8, kChunk / 16>(dk, ts, kSquareRow, dws, kRow, 16 * mt, 64 * half, lane);
    float rowPart[2] = {0.0f, 0.0f}, rowBeta[2] = {0.0f, 0.0f};
    forTile<8>(16 * mt, 64 * half, g, t, [&](int nt, int i, int r, int c) {
      const float p = dk[nt][i] * __bfloat162float(ks[r * kRow + c]) * __expf(cs[r]);
      rowPart[i / 2] += p;
      rowBeta[i / 2] += p * bs[r];
      dk[nt][i] *= bs[r] * __expf(cs[r]);
    });
    addRowSums(db, rowPart, 16 * mt, g, t);
    addRowSums(dc, rowBeta, 16 * mt, g, t);
    productAB<8, kChunk / 16>(dk, sq1, kSquareRow, ks, kRow, 16 * mt, 64 * half, g, t, lane);
    productAtB<8, kChunk / 16>(dk, sq1, kSquareRow, ks, kRow, 16 * mt, 64 * half, lane);
    forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
      const float2 part = *reinterpret_cast<const float2 *>(gradKeyPart + (rows0 + r) * kDim + c);
      if (r < valid)
        *reinterpret_cast<uint32_t *>(gradKey + (bh * tokens + row0 + r) * kDim + c) =
            packBf16(dk[nt][2 * h] + part.x, dk[nt][2 * h + 1] + part.y);
    });
  }
  { // dXv = T^T dU: dv = beta dXv; dbeta += v . dXv.
    float dv[8][4];
    zero(dv);
    productAtB<8, kChunk / 16>(dv, ts, kSquareRow, dns, kRow, 16 * mt, 64 * half, lane);
    float rowPart[2] = {0.0f, 0.0f};
    forTile<8>(16 * mt, 64 * half, g, t, [&](int nt, int i, int r, int c) {
      rowPart[i / 2] += dv[nt][i] * __bfloat162float(vs[r * kRow + c]);
    });
    addRowSums(db, rowPart, 16 * mt, g, t);
    forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
      if (r < valid)
        *reinterpret_cast<uint32_t *>(gradValue + (bh * tokens + row0 + r) * kDim + c) =
            packBf16(dv[nt][2 * h] * bs[r], dv[nt][2 * h + 1] * bs[r]);
    });
  }
  __syncthreads();
  // G = cumsum(g) within the chunk: dg_t = sum of dG over t' >= t.
  if (tid < valid) {
    float x = 0.0f;
    for (int r = kChunk - 1; r >= tid; --r)
      x += dc[r];
    gradDecay[bh * tokens + row0 + tid] = x;
    gradBeta[bh * tokens + row0 + tid] = db[tid];
  }
}

/// Kernel 4 with its dT scales in the epilogue, two blocks per SM (default;
/// ADAPT_DELTA_RULE_TWO_BLOCKS=0: the Xk/Xv tiles, one block).
bool twoBlocksPerSm() {
  static const bool on = !switchedOff("ADAPT_DELTA_RULE_TWO_BLOCKS");
  return on;
}

} // namespace

namespace {

/// What the backward's first three kernels leave: dq (bf16 [B, H, T, 128]),
/// and over the rows [B·H, n·64, 128] dk's part through O and S' (fp32;
/// for linear attention the whole dk, bf16 [B, H, T, 128]), dW (bf16),
/// dG's part (fp32 [B·H, n·64]; none for linear attention), dV_new and dS_0
/// (\p state, its dS' freed).
struct ThroughState {
  at::Tensor gradQuery, gradKeyPart, gradW, gradCumPart;
  DeltaRuleStateGrads state;
};

/// Kernels 1 to 3 (the scores, the state gradient, the chunk gradients) from
/// the forward's inputs, what it \p saved, and \p gradOut, \p gradFinal
/// (either may be undefined: zeros); \p scale multiplies q. Without
/// \p deltaRule (linear attention with a fixed decay, saved.w undefined)
/// kernel 3 writes the whole dk as bf16 [B, H, T, 128] into gradKeyPart and
/// no dG.
ThroughState backwardThroughState(const at::Tensor &query, const at::Tensor &key, const DeltaRuleSaved &saved,
                                  const at::Tensor &gradOut, const at::Tensor &gradFinal, float scale,
                                  bool deltaRule) {
  const int64_t batch = key.size(0), heads = key.size(1), tokens = key.size(2), bh = batch * heads;
  const int chunks = static_cast<int>((tokens + kChunk - 1) / kChunk);
  const int64_t padded = int64_t(chunks) * kChunk;
  const auto f32 = key.options().dtype(at::kFloat);
  at::Tensor dOut = gradOut.defined() ? gradOut.to(at::kBFloat16) : at::zeros({batch, heads, tokens, kDim}, key.options());
  if (dOut.stride(3) != 1 || dOut.stride(2) % 8 || dOut.stride(1) % 8 || dOut.stride(0) % 8 ||
      reinterpret_cast<uintptr_t>(dOut.data_ptr()) % 16)
    dOut = dOut.contiguous();
  at::Tensor dLast = gradFinal.defined() ? gradFinal.to(at::kFloat).contiguous().view({bh, kDim, kDim})
                                         : at::zeros({bh, kDim, kDim}, f32);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool async = asyncLoads();

  // dO as the rows [B·H, n·64, 128] kernels 2 and 3 read: under
  // leanBackward(), dO itself when it is contiguous and the tokens fill whole
  // chunks; else kernel 1's copy.
  const bool dOutIsRows = leanBackward() && dOut.is_contiguous() && tokens == padded;
  at::Tensor dOutRows = dOutIsRows ? dOut.view({bh, padded, kDim}) : at::empty({bh, padded, kDim}, key.options());
  ThroughState r;
  {
    at::Tensor keysToEnd = at::empty({bh, padded, kDim}, key.options()), queryDecayed = at::empty_like(keysToEnd);
    at::Tensor localNew = at::empty({bh, padded, kDim}, f32);
    const size_t bytes = 3 * kChunk * kRow * sizeof(bf16) + kChunk * kSquareRow * sizeof(bf16) + kChunk * sizeof(float);
    allowSharedMemory(deltaRuleLocalKernel, bytes);
    deltaRuleLocalKernel<<<dim3(chunks, bh), 256, bytes, stream>>>(
        stridedRows(query), stridedRows(key), stridedRows(dOut), saved.cum.data_ptr<float>(), tokens, scale, bf16Data(keysToEnd),
        bf16Data(queryDecayed), dOutIsRows ? nullptr : bf16Data(dOutRows), localNew.data_ptr<float>(), async);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    r.state = deltaRuleStateBackward(keysToEnd, queryDecayed, saved.w, dOutRows, localNew, saved.cum, dLast);
  }
  const bool bf16Grads = r.state.leaving.scalar_type() == at::kBFloat16;
  // The gradients are allocated once kernel 2's temporaries are freed, k's and
  // v's (by the caller) once kernel 3 no longer needs dS' (a lower peak: at 1
  // x 32 heads x 32K, dS' is 512 MiB and the two gradients as much).
  r.gradQuery = at::empty({batch, heads, tokens, kDim}, key.options());
  r.gradKeyPart = deltaRule ? at::empty({bh, padded, kDim}, f32) : at::empty_like(r.gradQuery);
  if (saved.w.defined())
    r.gradW = at::empty({bh, padded, kDim}, key.options());
  if (deltaRule)
    r.gradCumPart = at::empty({bh, padded}, f32);
  const size_t bytes = (5 * kChunk + kDim) * kRow * sizeof(bf16) + kChunk * kSquareRow * sizeof(bf16) +
                       (2 * kChunk + 2) * sizeof(float);
  auto kernel = deltaRule ? (bf16Grads ? deltaRuleChunkGradKernel<bf16> : deltaRuleChunkGradKernel<float>)
                          : (bf16Grads ? deltaRuleChunkGradKernel<bf16, false> : deltaRuleChunkGradKernel<float, false>);
  allowSharedMemory(kernel, bytes);
  kernel<<<dim3(chunks, bh), 256, bytes, stream>>>(
      stridedRows(query), stridedRows(key), bf16Data(dOutRows), bf16Data(saved.newValues), r.state.newValues.data_ptr(),
      bf16Data(saved.states), r.state.leaving.data_ptr(), saved.cum.data_ptr<float>(), tokens, scale,
      bf16Data(r.gradQuery), r.gradKeyPart.data_ptr(), r.gradW.defined() ? bf16Data(r.gradW) : nullptr,
      deltaRule ? r.gradCumPart.data_ptr<float>() : nullptr, async);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // Freed in stream order: the next kernel, on the same stream, may reuse its memory.
  r.state.leaving = at::Tensor();
  return r;
}

/// The gradients of a sequence without tokens: empty, and dS_0 = dS_T.
DeltaRuleGrads gradsOfNoTokens(const at::Tensor &key, const at::Tensor &gradFinal) {
  DeltaRuleGrads r;
  r.query = at::empty({key.size(0), key.size(1), key.size(2), kDim}, key.options());
  r.key = at::empty_like(r.query);
  r.value = at::empty_like(r.query);
  r.initialState = gradFinal.defined() ? gradFinal.to(at::kFloat)
                                       : at::zeros({key.size(0), key.size(1), kDim, kDim}, key.options().dtype(at::kFloat));
  return r;
}

} // namespace

DeltaRuleGrads gatedDeltaRuleBackward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                      const at::Tensor &beta, const DeltaRuleSaved &saved, const at::Tensor &gradOut,
                                      const at::Tensor &gradFinal) {
  TORCH_CHECK(deltaRuleForwardTakes(query, key, value, beta, beta, kChunk) && saved.w.defined() &&
                  saved.inverse.defined(),
              "gatedDeltaRuleBackward: expected the forward kernels' inputs and what they saved");
  const int64_t batch = key.size(0), heads = key.size(1), tokens = key.size(2), bh = batch * heads;
  const int chunks = static_cast<int>((tokens + kChunk - 1) / kChunk);
  const c10::cuda::CUDAGuard guard(key.device());
  const auto f32 = key.options().dtype(at::kFloat);
  if (tokens == 0 || bh == 0) {
    DeltaRuleGrads r = gradsOfNoTokens(key, gradFinal);
    r.beta = at::empty({batch, heads, tokens}, f32);
    r.decay = at::empty_like(r.beta);
    return r;
  }
  ThroughState through = backwardThroughState(query, key, saved, gradOut, gradFinal,
                                              static_cast<float>(1.0 / std::sqrt(double(kDim))), /*deltaRule=*/true);
  DeltaRuleGrads r;
  r.query = through.gradQuery;
  r.beta = at::empty({batch, heads, tokens}, f32);
  r.decay = at::empty_like(r.beta);
  r.key = at::empty_like(r.query);
  r.value = at::empty_like(r.query);
  const bool bf16Grads = through.state.newValues.scalar_type() == at::kBFloat16;
  at::Tensor b = beta.to(at::kFloat).contiguous();
  {
    const bool twoBlocks = twoBlocksPerSm();
    const size_t bytes = (twoBlocks ? 4 : 6) * kChunk * kRow * sizeof(bf16) +
                         3 * kChunk * kSquareRow * sizeof(bf16) + 4 * kChunk * sizeof(float);
    auto kernel = twoBlocks ? (bf16Grads ? deltaRuleTransformGradKernel<bf16, true>
                                         : deltaRuleTransformGradKernel<float, true>)
                            : (bf16Grads ? deltaRuleTransformGradKernel<bf16, false>
                                         : deltaRuleTransformGradKernel<float, false>);
    allowSharedMemory(kernel, bytes);
    kernel<<<dim3(chunks, bh), 256, bytes, at::cuda::getCurrentCUDAStream()>>>(
        stridedRows(key), stridedRows(value), b.data_ptr<float>(), saved.cum.data_ptr<float>(), bf16Data(saved.inverse),
        bf16Data(through.gradW), through.state.newValues.data_ptr(), through.gradKeyPart.data_ptr<float>(),
        through.gradCumPart.data_ptr<float>(), tokens, bf16Data(r.key), bf16Data(r.value), r.beta.data_ptr<float>(),
        r.decay.data_ptr<float>(), asyncLoads());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  r.initialState = through.state.initial.view({batch, heads, kDim, kDim});
  return r;
}

DeltaRuleGrads decayedLinearAttentionBackward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                              const DeltaRuleSaved &saved, const at::Tensor &gradOut,
                                              const at::Tensor &gradFinal, float scale) {
  TORCH_CHECK(linearAttentionTakes(query, key, value) && saved.states.defined() && saved.newValues.defined(),
              "decayedLinearAttentionBackward: expected the forward kernel's inputs and what it saved");
  const int64_t batch = key.size(0), heads = key.size(1), tokens = key.size(2);
  const c10::cuda::CUDAGuard guard(key.device());
  if (tokens == 0 || batch * heads == 0)
    return gradsOfNoTokens(key, gradFinal);
  ThroughState through = backwardThroughState(query, key, saved, gradOut, gradFinal, scale, /*deltaRule=*/false);
  // With W = 0 and U = V: dk is kernel 3's (bf16, by token), dv is dV_new.
  const int64_t padded = through.state.newValues.size(1);
  DeltaRuleGrads r;
  r.query = through.gradQuery;
  r.key = through.gradKeyPart;
  r.value = through.state.newValues.view({batch, heads, padded, kDim}).narrow(2, 0, tokens).to(at::kBFloat16);
  r.initialState = through.state.initial.view({batch, heads, kDim, kDim});
  return r;
}

} // namespace adapt::rt::cuda
