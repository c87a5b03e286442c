//===- KimiDeltaKernel.cu - the delta rule with a decay per key channel ---===//
//
// Three kernels (see KimiDeltaKernel.h): the per-chunk UT transform with
// the decay inside the key products, the state recurrence of
// DeltaRuleState.cuh in its per-channel form, the per-chunk output.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/KimiDeltaKernel.h"
#include "runtime/cuda/DeltaRule.cuh"
#include "runtime/cuda/DeltaRuleKernel.h"
#include "runtime/cuda/DeltaRuleState.cuh"
#include "runtime/cuda/Packed.cuh"

#include <ATen/cuda/CUDAContext.h>
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

constexpr int kSub = 16;                  ///< Tokens per sub-chunk.

/// How the forward kernels sum a sub-chunk's pairs (perChannelPairs).
enum class PairsForm : int {
  WarpPerPair,   ///< a warp per pair, four channels a lane (ADAPT_KIMI_PAIRS_PER_THREAD=0)
  ThreadPerPair, ///< a thread per pair, a channel a step (withinPairsPerThread)
  Packed,        ///< a thread per pair, eight channels a step, and the decays applied eight at a time
};
constexpr int kPairRow = kChunk + 1;       ///< Row of a [64][65] fp32 pair table.

/// out[e] = a[e] - b[e] for the eight fp32 at \p a and \p b (32-byte
/// aligned), each row read as two 16-byte halves in the order (lane / 4) % 2
/// and put back in order by selects: where a quarter warp's lanes read
/// 32-byte groups 32 bytes apart (rows of 128 floats, lane-rotated groups),
/// the halves then fall in its eight distinct bank groups instead of two
/// lanes to each of four.
__device__ __forceinline__ void differencesOfEight(float (&out)[8], const float *a, const float *b, int lane) {
  const int swap = (lane >> 2) & 1, first = 4 * swap, second = 4 - 4 * swap;
  const Pack<float> a0 = Pack<float>::load(a + first), b0 = Pack<float>::load(b + first);
  const Pack<float> a1 = Pack<float>::load(a + second), b1 = Pack<float>::load(b + second);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float inFirst = a0.v[i] - b0.v[i], inSecond = a1.v[i] - b1.v[i];
    out[i] = swap ? inSecond : inFirst;
    out[4 + i] = swap ? inFirst : inSecond;
  }
}

/// sum_d x_d y_d e^{gx_d - gy_d} over the 128 channels of one pair of rows
/// (bf16 x, y; fp32 gx, gy), eight channels a step: one 16-byte load of each
/// bf16 row and two of each G row (differencesOfEight), where the scalar
/// loop of withinPairsPerThread spends four loads and their address
/// arithmetic on every channel (session 58's Nsight Compute profile of the
/// output kernel: the integer pipe its busiest, 62M unfused fp32
/// instructions against 9M fused). Lane l starts at group l (mod 16).
__device__ __forceinline__ float decayedRowsDot(const bf16 *x, const bf16 *y, const float *gx, const float *gy,
                                                int lane) {
  constexpr int kGroups = kDim / 8;
  float sum = 0.0f;
#pragma unroll 2
  for (int s = 0; s < kGroups; ++s) {
    const int d = 8 * ((s + lane) & (kGroups - 1));
    const Pack<bf16> xv = Pack<bf16>::load(x + d), yv = Pack<bf16>::load(y + d);
    float exponent[8];
    differencesOfEight(exponent, gx + d, gy + d, lane);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      sum += xv.v[e] * yv.v[e] * __expf(exponent[e]);
  }
  return sum;
}

/// Rows [0, rows) of \p dst = those of \p src (bf16, row stride kRow) times
/// e^{sign (G_r - ref)} per channel, G's rows [rows][128] and \p ref [128]
/// fp32: eight channels a thread a step, rounded once to bf16 as the
/// scalar loops were (the same values). No barrier.
__device__ __forceinline__ void decayRows(bf16 *dst, const bf16 *src, const float *G, const float *ref, int rows,
                                          float sign) {
  for (int i = threadIdx.x; i < rows * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), d = 8 * (i % (kDim / 8));
    Pack<bf16> v = Pack<bf16>::load(src + r * kRow + d);
    float exponent[8];
    differencesOfEight(exponent, G + r * kDim + d, ref + d, threadIdx.x % 32);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      v.v[e] *= __expf(sign * exponent[e]);
    v.store(dst + r * kRow + d);
  }
}

/// Zeros the entries above the diagonal of each 16 x 16 diagonal block of
/// \p out [64][kPairRow]. No barrier.
__device__ __forceinline__ void zeroAboveSubDiagonal(float *out) {
  for (int i = threadIdx.x; i < (kChunk / kSub) * kSub * kSub; i += blockDim.x) {
    const int block = i / (kSub * kSub), rr = (i / kSub) % kSub, cc = i % kSub;
    if (cc > rr)
      out[(kSub * block + rr) * kPairRow + kSub * block + cc] = 0.0f;
  }
}

/// The pairs within each sub-chunk of perChannelPairs, a thread per pair of
/// each 16 x 16 block's lower triangle (the diagonal included; written as 0
/// unless \p inclusive), summing its 128 channels in a register: no
/// cross-lane reduction and no warp spent above the diagonal, the form that
/// made the standalone scores kernel 3x faster (PerChannelScoresKernel.cu,
/// session 44). Lane l starts at channel l and wraps, so a warp's G reads
/// (fp32 rows of 128, one bank per channel) fall in 32 banks whatever rows
/// its pairs touch. Above the diagonal within a block: 0.
/// The default since session 46's checks on an H100 (Kimi forward at 1 x 32 x
/// 32K: 13.2 -> 11.1 ms); ADAPT_KIMI_PAIRS_PER_THREAD=0 keeps a warp per row.
__device__ void withinPairsPerThread(float *out, const bf16 *x, const bf16 *y, const float *G, bool inclusive) {
  constexpr int kTriangle = kSub * (kSub + 1) / 2; // pairs c <= r of one block
  const int tid = threadIdx.x, lane = tid % 32;
  for (int p = tid; p < (kChunk / kSub) * kTriangle; p += blockDim.x) {
    const int block = p / kTriangle, q = p % kTriangle;
    // Pair q of the triangle, row by row: rr (rr + 1) / 2 <= q < (rr + 1) (rr + 2) / 2.
    int rr = static_cast<int>((sqrtf(8.0f * static_cast<float>(q) + 1.0f) - 1.0f) * 0.5f);
    while (rr * (rr + 1) / 2 > q)
      --rr;
    while ((rr + 1) * (rr + 2) / 2 <= q)
      ++rr;
    const int r = kSub * block + rr, c = kSub * block + (q - rr * (rr + 1) / 2);
    float sum = 0.0f;
    if (c < r || inclusive) {
      const bf16 *xr = x + r * kRow, *yc = y + c * kRow;
      const float *gr = G + r * kDim, *gc = G + c * kDim;
      for (int k = 0; k < kDim; ++k) {
        const int d = (k + lane) & (kDim - 1);
        sum += __bfloat162float(xr[d]) * __bfloat162float(yc[d]) * __expf(gr[d] - gc[d]);
      }
    }
    out[r * kPairRow + c] = sum;
  }
  zeroAboveSubDiagonal(out);
}

/// sum_d x_d y_d over 128 channels, eight a step from lane-rotated groups
/// (the diagonal pairs, whose decay factor is e^0 = 1).
__device__ __forceinline__ float rowsDot(const bf16 *x, const bf16 *y, int lane) {
  constexpr int kGroups = kDim / 8;
  float sum = 0.0f;
#pragma unroll 4
  for (int s = 0; s < kGroups; ++s) {
    const int d = 8 * ((s + lane) & (kGroups - 1));
    const Pack<bf16> xv = Pack<bf16>::load(x + d), yv = Pack<bf16>::load(y + d);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      sum += xv.v[e] * yv.v[e];
  }
  return sum;
}

/// withinPairsPerThread's result, PairsForm::Packed: the 480 pairs strictly
/// below each block's diagonal a thread each through decayedRowsDot (15
/// warps' worth, so two rounds of 8 warps where the 544 pairs with the
/// diagonal took three, the third for one warp), then the 64 diagonal pairs,
/// x_r . y_r or 0 unless \p inclusive, in the last round's free warp and a
/// cheap third round (no decays to load or exponentiate).
__device__ void withinPairsPacked(float *out, const bf16 *x, const bf16 *y, const float *G, bool inclusive) {
  constexpr int kStrict = kSub * (kSub - 1) / 2, kTasks = (kChunk / kSub) * kStrict;
  const int lane = threadIdx.x % 32;
  for (int p = threadIdx.x; p < kTasks + kChunk; p += blockDim.x) {
    if (p >= kTasks) {
      const int r = p - kTasks;
      out[r * kPairRow + r] = inclusive ? rowsDot(x + r * kRow, y + r * kRow, lane) : 0.0f;
      continue;
    }
    const int block = p / kStrict, q = p % kStrict;
    // Pair q of the strict triangle, row by row: rr (rr - 1) / 2 <= q < rr (rr + 1) / 2.
    int rr = static_cast<int>((sqrtf(8.0f * static_cast<float>(q) + 1.0f) + 1.0f) * 0.5f);
    while (rr * (rr - 1) / 2 > q)
      --rr;
    while (rr * (rr + 1) / 2 <= q)
      ++rr;
    const int r = kSub * block + rr, c = kSub * block + (q - rr * (rr - 1) / 2);
    out[r * kPairRow + c] = decayedRowsDot(x + r * kRow, y + c * kRow, G + r * kDim, G + c * kDim, lane);
  }
  zeroAboveSubDiagonal(out);
}

/// out[t][i] = sum_d x_td y_id e^{G_td - G_id} for i < t (i <= t when
/// \p inclusive), zero above: x, y [64][kRow] bf16 tiles, G [64][128] fp32
/// (the chunk's cumulative log decay per channel), out [64][kPairRow] fp32.
/// Pairs within a sub-chunk of 16 are summed term by term, a warp per pair;
/// a pair across sub-chunks factors through G at the key sub-chunk j's last
/// token r_j: (x_t e^{G_t - r_j}) . (y_i e^{r_j - G_i}), both factors <= 1
/// (log decays are <= 0 and t > r_j >= i), one mma product per (query
/// sub-chunk, j). \p xs [64][kRow] and \p ys [16][kRow] are scratch. With
/// \p perThread the pairs within a sub-chunk take a thread each instead
/// (withinPairsPerThread); \p form Packed also decays the scratch rows
/// eight channels at a time (decayRows). Every thread of a 256-thread block
/// calls it; it ends with a barrier.
__device__ void perChannelPairs(float *out, const bf16 *x, const bf16 *y, const float *G, bool inclusive, bf16 *xs,
                                bf16 *ys, PairsForm form) {
  const bool perThread = form != PairsForm::WarpPerPair, packed = form == PairsForm::Packed;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int i = tid; i < kChunk * kChunk; i += blockDim.x) { // the blocks above the diagonal
    const int r = i / kChunk, c = i % kChunk;
    if (c / kSub > r / kSub)
      out[r * kPairRow + c] = 0.0f;
  }
  if (packed)
    withinPairsPacked(out, x, y, G, inclusive);
  else if (perThread)
    withinPairsPerThread(out, x, y, G, inclusive);
  // Within each sub-chunk: pair (r, c) by one warp, four channels per lane.
  for (int pair = warp; !perThread && pair < (kChunk / kSub) * kSub * kSub; pair += blockDim.x / 32) {
    const int block = pair / (kSub * kSub), r = kSub * block + (pair / kSub) % kSub, c = kSub * block + pair % kSub;
    float sum = 0.0f;
    if (c < r || (inclusive && c == r)) {
#pragma unroll
      for (int q = 0; q < kDim / 32; ++q) {
        const int d = lane + 32 * q;
        sum += __bfloat162float(x[r * kRow + d]) * __bfloat162float(y[c * kRow + d]) *
               __expf(G[r * kDim + d] - G[c * kDim + d]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (lane == 0)
      out[r * kPairRow + c] = sum;
  }
  // Across: key sub-chunk j against every later query row.
  for (int j = 0; j < kChunk / kSub - 1; ++j) {
    const float *ref = G + (kSub * j + kSub - 1) * kDim;
    const int first = kSub * (j + 1);
    if (packed) {
      decayRows(xs + first * kRow, x + first * kRow, G + first * kDim, ref, kChunk - first, 1.0f);
      decayRows(ys, y + kSub * j * kRow, G + kSub * j * kDim, ref, kSub, -1.0f);
    }
    for (int i = tid; !packed && i < (kChunk - first) * kDim; i += blockDim.x) {
      const int r = first + i / kDim, d = i % kDim;
      xs[r * kRow + d] = __float2bfloat16(__bfloat162float(x[r * kRow + d]) * __expf(G[r * kDim + d] - ref[d]));
    }
    for (int i = tid; !packed && i < kSub * kDim; i += blockDim.x) {
      const int r = i / kDim, d = i % kDim, key = kSub * j + r;
      ys[r * kRow + d] = __float2bfloat16(__bfloat162float(y[key * kRow + d]) * __expf(ref[d] - G[key * kDim + d]));
    }
    __syncthreads();
    if (warp < 2 * (kChunk / kSub - 1 - j)) { // a warp per 16 query rows and 8 keys
      const int m0 = first + kSub * (warp / 2), n0 = 8 * (warp % 2);
      float acc[1][4];
      zero(acc);
      productABt<1, kDim / 16>(acc, xs, kRow, ys, kRow, m0, n0, g, t);
      forTile<1>(m0, n0, g, t, [&](int nt, int i, int r, int c) { out[r * kPairRow + kSub * j + c] = acc[nt][i]; });
    }
    __syncthreads();
  }
}

constexpr int kCumsumBatch = 8; ///< Rows of staged decays a channel's thread loads before summing them.

/// Copies the chunk's log decays [valid][128] from global \p chunkDecay into
/// \p G [64][128], 16 bytes a load from every thread, rows from \p valid on
/// zero (they then add nothing to the running sums); with \p async as
/// cp.async copies (awaitCopies before the barrier). No barrier.
__device__ __forceinline__ void stageDecays(float *G, const float *chunkDecay, int valid, bool async) {
  for (int i = threadIdx.x; i < kChunk * kDim / 4; i += blockDim.x)
    copy16(G + 4 * i, chunkDecay + 4 * i, i / (kDim / 4) < valid, async);
}

/// Kernel 1, a block (256 threads) per (chunk, b·h): G per channel (out,
/// and the chunk's last G), the keys decayed to the chunk's end, W and U
/// ([B·H, n·64, 128] bf16 each), and T (fp32 [B·H, n·64, 64]) when \p
/// inverseOut is given (training: the backward reads it).
__global__ void __launch_bounds__(256)
    kimiTransformKernel(Strided key, Strided value, const float *decay, const float *beta, int64_t tokens, bf16 *w,
                        bf16 *u, bf16 *keysToEnd, float *cumOut, float *lastOut, float *inverseOut, int inverseForm,
                        PairsForm pairs, bool stagedDecay, bool async) {
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *ks = reinterpret_cast<bf16 *>(shared); // k, then beta k e^G
  bf16 *vs = ks + kChunk * kRow;                // v, then beta v
  bf16 *xs = vs + kChunk * kRow;                // scratch of perChannelPairs
  bf16 *ys = xs + kChunk * kRow;
  bf16 *ts = ys + kSub * kRow;                  // T in bf16
  float *a = reinterpret_cast<float *>(ts + kChunk * kSquareRow); // A, then T [64][65]
  float *G = a + kChunk * kPairRow;             // [64][128]
  float *betas = G + kChunk * kDim;
  const int chunks = gridDim.x;
  const int64_t bh = blockIdx.y, n = blockIdx.x, row0 = n * kChunk, padded = int64_t(chunks) * kChunk;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  loadRows(ks, key, bh, row0, valid, async);
  loadRows(vs, value, bh, row0, valid, async);
  if (tid < kChunk)
    betas[tid] = tid < valid ? beta[bh * tokens + row0 + tid] : 0.0f;
  if (stagedDecay) {
    stageDecays(G, decay + (bh * tokens + row0) * kDim, valid, async);
    awaitCopies(async);
    __syncthreads();
  }
  if (tid < kDim) { // G = cumsum(g) down the chunk, a thread per channel
    float run = 0.0f;
    if (stagedDecay) {
      for (int r0 = 0; r0 < kChunk; r0 += kCumsumBatch) {
        float batch[kCumsumBatch]; // the batch's loads issued together, then the sums in order
#pragma unroll
        for (int j = 0; j < kCumsumBatch; ++j)
          batch[j] = G[(r0 + j) * kDim + tid];
#pragma unroll
        for (int j = 0; j < kCumsumBatch; ++j) {
          run += batch[j];
          G[(r0 + j) * kDim + tid] = run;
          cumOut[(bh * padded + row0 + r0 + j) * kDim + tid] = run;
        }
      }
    } else {
      for (int r = 0; r < kChunk; ++r) {
        if (r < valid)
          run += decay[(bh * tokens + row0 + r) * kDim + tid];
        G[r * kDim + tid] = run;
        cumOut[(bh * padded + row0 + r) * kDim + tid] = run;
      }
    }
    lastOut[(bh * chunks + n) * kDim + tid] = run;
  }
  awaitCopies(async && !stagedDecay);
  __syncthreads();
  perChannelPairs(a, ks, ks, G, /*inclusive=*/false, xs, ys, pairs);
  for (int i = tid; i < kChunk * kChunk; i += blockDim.x) { // A = beta_t (pairs), strictly lower
    const int r = i / kChunk, c = i % kChunk;
    a[r * kPairRow + c] = c < r ? a[r * kPairRow + c] * betas[r] : 0.0f;
  }
  __syncthreads();
  if (inverseForm) // ts is free until T is written to it below
    invertUnitLowerBlocked(a, reinterpret_cast<float *>(ts), tid, inverseForm == 2);
  else
    invertUnitLower(a, tid);
  for (int i = tid; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, c = i % kChunk;
    const float x = c < r ? a[r * kPairRow + c] : c == r ? 1.0f : 0.0f;
    ts[r * kSquareRow + c] = __float2bfloat16(x);
    if (inverseOut)
      inverseOut[(bh * padded + row0 + r) * kChunk + c] = x;
  }
  const float *last = G + (kChunk - 1) * kDim;
  if (pairs == PairsForm::Packed) // as the loop below, eight channels a step
    for (int i = tid; i < kChunk * kDim / 8; i += blockDim.x) {
      const int r = i / (kDim / 8), d = 8 * (i % (kDim / 8));
      Pack<bf16> k = Pack<bf16>::load(ks + r * kRow + d), v = Pack<bf16>::load(vs + r * kRow + d), toEnd;
      const Pack<float> g0 = Pack<float>::load(G + r * kDim + d), g1 = Pack<float>::load(G + r * kDim + d + 4);
      float toEndExponent[8];
      differencesOfEight(toEndExponent, last + d, G + r * kDim + d, lane);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        toEnd.v[e] = k.v[e] * __expf(toEndExponent[e]);
        k.v[e] = k.v[e] * betas[r] * __expf(e < 4 ? g0.v[e] : g1.v[e - 4]);
        v.v[e] *= betas[r];
      }
      toEnd.store(keysToEnd + (bh * padded + row0 + r) * kDim + d);
      k.store(ks + r * kRow + d);
      v.store(vs + r * kRow + d);
    }
  for (int i = tid; pairs != PairsForm::Packed && i < kChunk * kDim; i += blockDim.x) {
    const int r = i / kDim, d = i % kDim;
    const float k = __bfloat162float(ks[r * kRow + d]);
    keysToEnd[(bh * padded + row0 + r) * kDim + d] = __float2bfloat16(k * __expf(last[d] - G[r * kDim + d]));
    ks[r * kRow + d] = __float2bfloat16(k * betas[r] * __expf(G[r * kDim + d]));
    vs[r * kRow + d] = __float2bfloat16(__bfloat162float(vs[r * kRow + d]) * betas[r]);
  }
  __syncthreads();
  // W = T (beta k e^G), U = T (beta v): a warp per 16 rows and 64 columns.
  const int mt = warp % 4, half = warp / 4;
  storeTransformed(w + (bh * padded + row0) * kDim, ts, ks, mt, half, g, t, lane);
  storeTransformed(u + (bh * padded + row0) * kDim, ts, vs, mt, half, g, t, lane);
}

/// Copies S_n [128][128] into \p ss and V_new's chunk rows [64][128] into
/// \p vs (row stride kRow), 16 bytes a copy; with \p async as cp.async
/// copies (awaitCopies before the barrier). No barrier.
__device__ __forceinline__ void loadStateAndNewValues(bf16 *ss, bf16 *vs, const bf16 *state, const bf16 *chunkValues,
                                                      bool async) {
  for (int i = threadIdx.x; i < kDim * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    copy16(ss + r * kRow + c, state + r * kDim + c, true, async);
    if (r < kChunk)
      copy16(vs + r * kRow + c, chunkValues + r * kDim + c, true, async);
  }
}

/// Kernel 3, a block (256 threads) per (chunk, b·h): the chunk's output
/// rows, (q scale e^G) S_n + causal(scale sum_d q_td k_id e^{G_td - G_id}) V_new;
/// the causal scores as it used them (bf16 [B·H, n·64, 64]) to \p scoresOut
/// when given. With \p TwoBlocks, S_n and V_new are loaded after the
/// scores, over the tiles the scores were built in (k and the pairs'
/// scratch; the pairs' scratch rows and A), so that a block takes 112.5 KiB of
/// shared memory instead of 163.5 and two share an SM: with one, eight warps
/// wait out every barrier and load alone (the default since session 51's
/// H100 checks; ADAPT_KIMI_OUTPUT_TWO_BLOCKS=0: one block).
template <bool TwoBlocks>
__global__ void __launch_bounds__(256, TwoBlocks ? 2 : 1)
    kimiOutputKernel(Strided query, Strided key, const bf16 *states, const bf16 *newValues, const float *cum,
                     int64_t tokens, float scale, bf16 *out, bf16 *scoresOut, PairsForm pairs, bool async) {
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *qs = reinterpret_cast<bf16 *>(shared); // q, then q scale e^G
  bf16 *ks = qs + kChunk * kRow;
  bf16 *xs, *ys, *ss, *vs, *ps; // the pairs' scratch, S_n [128][kRow], V_new, the causal scores [64][kSquareRow]
  float *a, *G;                 // [64][65], [64][128]
  if constexpr (TwoBlocks) {
    xs = ks + kChunk * kRow, ys = xs + kChunk * kRow;
    a = reinterpret_cast<float *>(ys + kSub * kRow), G = a + kChunk * kPairRow;
    ps = reinterpret_cast<bf16 *>(G + kChunk * kDim);
    ss = ks; // 128 rows over k and xs, after the scores
    vs = ys; // 64 rows over ys and a (4.25 + 16.25 KiB for 17 KiB), after the scores
  } else {
    vs = ks + kChunk * kRow, xs = vs + kChunk * kRow, ys = xs + kChunk * kRow;
    ss = ys + kSub * kRow, ps = ss + kDim * kRow;
    a = reinterpret_cast<float *>(ps + kChunk * kSquareRow), G = a + kChunk * kPairRow;
  }
  const int chunks = gridDim.x;
  const int64_t bh = blockIdx.y, row0 = int64_t(blockIdx.x) * kChunk, padded = int64_t(chunks) * kChunk;
  const int valid = static_cast<int>(tokens - row0 < kChunk ? tokens - row0 : kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bf16 *state = states + (bh * chunks + blockIdx.x) * kDim * kDim;
  const bf16 *chunkValues = newValues + (bh * padded + row0) * kDim;
  loadRows(qs, query, bh, row0, valid, async);
  loadRows(ks, key, bh, row0, valid, async);
  if constexpr (!TwoBlocks)
    loadStateAndNewValues(ss, vs, state, chunkValues, async);
  for (int i = tid; i < kChunk * kDim / 4; i += blockDim.x)
    copy16(G + 4 * i, cum + (bh * padded + row0) * kDim + 4 * i, true, async);
  awaitCopies(async);
  __syncthreads();
  perChannelPairs(a, qs, ks, G, /*inclusive=*/true, xs, ys, pairs);
  for (int i = tid; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, c = i % kChunk;
    ps[r * kSquareRow + c] = __float2bfloat16(c <= r ? a[r * kPairRow + c] * scale : 0.0f);
  }
  for (int i = tid; pairs == PairsForm::Packed && i < kChunk * kDim / 8; i += blockDim.x) { // eight channels a step
    const int r = i / (kDim / 8), d = 8 * (i % (kDim / 8));
    Pack<bf16> q = Pack<bf16>::load(qs + r * kRow + d);
    const Pack<float> g0 = Pack<float>::load(G + r * kDim + d), g1 = Pack<float>::load(G + r * kDim + d + 4);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      q.v[e] = q.v[e] * scale * __expf(e < 4 ? g0.v[e] : g1.v[e - 4]);
    q.store(qs + r * kRow + d);
  }
  for (int i = tid; pairs != PairsForm::Packed && i < kChunk * kDim; i += blockDim.x) {
    const int r = i / kDim, d = i % kDim;
    qs[r * kRow + d] = __float2bfloat16(__bfloat162float(qs[r * kRow + d]) * scale * __expf(G[r * kDim + d]));
  }
  __syncthreads();
  if constexpr (TwoBlocks) { // k, the scratch and A are free now
    loadStateAndNewValues(ss, vs, state, chunkValues, async);
    awaitCopies(async);
    __syncthreads();
  }
  if (scoresOut) // 16 bytes (8 scores) a copy, 8 a row
    for (int i = tid; i < kChunk * kChunk / 8; i += blockDim.x) {
      const int r = i / (kChunk / 8), c = (i % (kChunk / 8)) * 8;
      copy16<false>(scoresOut + (bh * padded + row0 + r) * kChunk + c, ps + r * kSquareRow + c);
    }
  const int mt = warp % 4, half = warp / 4;
  storeChunkOutput(out + (bh * tokens + row0) * kDim, qs, ss, ps, vs, valid, mt, half, g, t, lane);
}

/// The transform kernel's shared memory: 112.75 KiB, two blocks an SM at the
/// largest carveout (asked for with the staged decays).
constexpr size_t kTransformBytes = (3 * kChunk + kSub) * kRow * sizeof(bf16) + kChunk * kSquareRow * sizeof(bf16) +
                                   (kChunk * kPairRow + kChunk * kDim + kChunk) * sizeof(float);
static_assert(2 * (kTransformBytes + 1024) <= 228 * 1024, "two transform blocks must share an SM");

/// The output kernel's shared memory: 163.5 KiB, or 112.5 KiB \p twoBlocks.
constexpr size_t outputKernelBytes(bool twoBlocks) {
  return (twoBlocks ? (3 * kChunk + kSub) * kRow : (4 * kChunk + kSub + kDim) * kRow) * sizeof(bf16) +
         kChunk * kSquareRow * sizeof(bf16) + (kChunk * kPairRow + kChunk * kDim) * sizeof(float);
}
static_assert(2 * (outputKernelBytes(true) + 1024) <= 228 * 1024, "two output blocks must share an SM");

/// Whether the output kernel takes its two-blocks-an-SM layout (unless ADAPT_KIMI_OUTPUT_TWO_BLOCKS=0).
bool outputTwoBlocks() {
  static const bool on = !switchedOff("ADAPT_KIMI_OUTPUT_TWO_BLOCKS");
  return on;
}

/// How the transform and output kernels sum a sub-chunk's pairs: eight
/// channels a step (PairsForm::Packed; the default since session 58's H100
/// checks: KDA forward 2.02 -> 1.61 ms at 1 x 32 x 8K), a channel a step
/// with ADAPT_KIMI_PACKED_PAIRS=0, a warp per pair with
/// ADAPT_KIMI_PAIRS_PER_THREAD=0.
PairsForm pairsForm() {
  static const PairsForm form = switchedOff("ADAPT_KIMI_PAIRS_PER_THREAD") ? PairsForm::WarpPerPair
                                : switchedOff("ADAPT_KIMI_PACKED_PAIRS")  ? PairsForm::ThreadPerPair
                                                                          : PairsForm::Packed;
  return form;
}

/// Whether the transform and output kernels load their tiles (q, k, v, the
/// decays, S_n and V_new) as cp.async copies, all of a thread's in flight at
/// once (ADAPT_KIMI_ASYNC_COPIES=1; written in session 58). Nsight Compute
/// put 31 % of the output kernel's stall samples (22 % of the transform's)
/// on its plain 16-byte copies, each load waited out before its store.
bool asyncCopies() {
  static const bool on = switchedOn("ADAPT_KIMI_ASYNC_COPIES");
  return on;
}

/// Whether the transform kernel stages the chunk's log decays in shared
/// memory before summing them (the default since session 51's H100 checks;
/// ADAPT_KIMI_STAGED_DECAY=0: the plain loop). The plain loop adds one decay from global memory a
/// row: the next row's load waits behind this row's store (the compiler
/// cannot move it past a store that may alias), so 64 memory latencies in
/// sequence per chunk while the block's other warps wait at the barrier (at
/// ~0.5 us each, ~30 us a chunk). Staged, the loads are 16-byte and all in
/// flight at once, and the sums (in the same order, bitwise the same G) read
/// shared memory; the kernel then asks for the largest shared-memory
/// carveout, where two of its blocks (112.75 KiB each) share an SM.
bool stagedDecays() {
  static const bool on = !switchedOff("ADAPT_KIMI_STAGED_DECAY");
  return on;
}

} // namespace

bool kimiDeltaKernelEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_DELTA_KERNEL");
  return on;
}

bool kimiSavedScoresEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_SAVED_SCORES");
  return on;
}

bool kimiDeltaTrainingKernelEnabled() {
  static const bool on = kimiDeltaKernelEnabled() && !switchedOff("ADAPT_KIMI_DELTA_TRAIN_KERNEL");
  return on;
}

bool kimiDeltaRuleForwardTakes(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                               const at::Tensor &decay, const at::Tensor &beta, int64_t chunkSize) {
  // The scalar-decay kernels' conditions on q, k, v and beta (beta passed as
  // their decay too), then a decay per key channel.
  return deltaRuleForwardTakes(query, key, value, beta, beta, chunkSize) && decay.dim() == 4 &&
         decay.sizes() == key.sizes() && at::isFloatingType(decay.scalar_type()) && decay.device() == key.device();
}

at::Tensor kimiDeltaRuleForward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                const at::Tensor &decay, const at::Tensor &beta, const at::Tensor &initialState,
                                at::Tensor *finalState, KimiDeltaSaved *saved) {
  TORCH_CHECK(kimiDeltaRuleForwardTakes(query, key, value, decay, beta, kChunk),
              "kimiDeltaRuleForward: expected bf16 [B, H, T, 128] query, key, value with packable rows, a [B, H, "
              "T, 128] decay and a [B, H, T] beta");
  const int64_t batch = key.size(0), heads = key.size(1), tokens = key.size(2), bh = batch * heads;
  const c10::cuda::CUDAGuard guard(key.device());
  const auto f32 = key.options().dtype(at::kFloat);
  at::Tensor out = at::empty({batch, heads, tokens, kDim}, key.options());
  if (tokens == 0 || bh == 0) {
    if (finalState)
      *finalState = initialState.defined() ? initialState.to(at::kFloat).clone()
                                           : at::zeros({batch, heads, kDim, kDim}, f32);
    return out;
  }
  TORCH_CHECK(bh <= 65535, "kimiDeltaRuleForward: at most 65,535 batch x heads, got ", bh);
  const int chunks = static_cast<int>((tokens + kChunk - 1) / kChunk);
  const int64_t padded = int64_t(chunks) * kChunk;
  at::Tensor g = decay.to(at::kFloat).contiguous(), b = beta.to(at::kFloat).contiguous();
  at::Tensor w = at::empty({bh, padded, kDim}, key.options()), u = at::empty_like(w), vNew = at::empty_like(w);
  at::Tensor keysToEnd = at::empty({batch, heads, padded, kDim}, key.options());
  at::Tensor cum = at::empty({bh, padded, kDim}, f32), last = at::empty({bh, chunks, kDim}, f32);
  at::Tensor states = at::empty({bh, chunks, kDim, kDim}, key.options());
  at::Tensor inverse = saved ? at::empty({bh, padded, kChunk}, f32) : at::Tensor();
  at::Tensor scores =
      saved && kimiSavedScoresEnabled() ? at::empty({bh, padded, kChunk}, key.options()) : at::Tensor();
  at::Tensor init;
  if (initialState.defined()) {
    TORCH_CHECK(initialState.numel() == bh * kDim * kDim, "kimiDeltaRuleForward: expected an initial state [B, H, 128, 128]");
    init = initialState.to(at::kFloat).contiguous();
  }
  at::Tensor finalOut = finalState ? at::empty({batch, heads, kDim, kDim}, f32) : at::Tensor();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  allowSharedMemory(kimiTransformKernel, kTransformBytes);
  const bool staged = stagedDecays() && reinterpret_cast<uintptr_t>(g.data_ptr<float>()) % 16 == 0; // 16-byte loads
  if (staged)
    preferLargestCarveout(kimiTransformKernel);
  kimiTransformKernel<<<dim3(chunks, bh), 256, kTransformBytes, stream>>>(
      stridedRows(key), stridedRows(value), g.data_ptr<float>(), b.data_ptr<float>(), tokens, bf16Data(w),
      bf16Data(u), bf16Data(keysToEnd), cum.data_ptr<float>(), last.data_ptr<float>(),
      inverse.defined() ? inverse.data_ptr<float>() : nullptr, inverseForm(), pairsForm(), staged,
      asyncCopies());
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  // The state kernel's prefetching form (checked with per-channel decays on
  // an H200, session 43); ADAPT_KIMI_DELTA_PREFETCH=0 keeps the plain one.
  static const bool prefetch = asyncLoads() && !switchedOff("ADAPT_KIMI_DELTA_PREFETCH");
  const auto [columns, warps] = stateLaunch(bh);
  auto stateKernel = stateKernelFor<true>(prefetch, columns, warps);
  stateKernel<<<dim3(kDim / columns, bh), 32 * warps, stateKernelBytes(prefetch, columns), stream>>>(
      stridedRows(keysToEnd), bf16Data(w), bf16Data(u), last.data_ptr<float>(), tokens, chunks,
      init.defined() ? init.data_ptr<float>() : nullptr, bf16Data(states), bf16Data(vNew),
      finalOut.defined() ? finalOut.data_ptr<float>() : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const bool twoBlocks = outputTwoBlocks();
  const size_t outputBytes = outputKernelBytes(twoBlocks);
  const auto outputKernel = twoBlocks ? kimiOutputKernel<true> : kimiOutputKernel<false>;
  allowSharedMemory(outputKernel, outputBytes);
  if (twoBlocks)
    preferLargestCarveout(outputKernel);
  outputKernel<<<dim3(chunks, bh), 256, outputBytes, stream>>>(
      stridedRows(query), stridedRows(key), bf16Data(states), bf16Data(vNew), cum.data_ptr<float>(), tokens,
      static_cast<float>(1.0 / std::sqrt(double(kDim))), bf16Data(out), scores.defined() ? bf16Data(scores) : nullptr,
      pairsForm(), asyncCopies());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (finalState)
    *finalState = finalOut;
  if (saved)
    *saved = {inverse, states, vNew, scores};
  return out;
}

} // namespace adapt::rt::cuda
