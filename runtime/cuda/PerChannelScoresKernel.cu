//===- PerChannelScoresKernel.cu - Kimi's decayed scores and their gradient ===//
//
// The pairwise products of Kimi delta attention's chunked form, with a decay
// per key channel, for chunks of up to 64 tokens and up to 128 channels:
//   P[t][i] = sum_d x_td y_id e^{G_td - G_id}   (i <= t, zero above)
// and, for a cotangent g of P,
//   dx_td = sum_{i <= t} g_ti y_id e^{G_td - G_id},
//   dy_id = sum_{t >= i} g_ti x_td e^{G_td - G_id}.
// fp32 throughout, one exponential per term: G is a cumulative sum of log
// decays (<= 0) down the chunk, so every exponent here is <= 0 and nothing
// overflows; a term underflows only where its exact value is smaller still.
// The LibTorch composition (runtime/KimiDeltaFunction.cpp) materialises
// sub-chunk tensors 16 times a chunk's size for the same sums; these
// kernels keep a chunk's operands in shared memory, a block per chunk.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/PerChannelScoresKernel.h"
#include "runtime/cuda/PerChannelScores.cuh"
#include "runtime/cuda/Switches.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>

namespace adapt::rt::cuda {

using namespace scores;

namespace {

constexpr int kMaxChunk = 64;     ///< Tokens per chunk, at most.
constexpr int kMaxChannels = 128; ///< Key channels, at most.
constexpr int kThreads = 256;

/// Copies \p count floats from global \p src to shared \p dst (float4 when aligned).
__device__ __forceinline__ void copyFloats(float *dst, const float *src, int count) {
  if (count % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    for (int i = threadIdx.x; i < count / 4; i += blockDim.x)
      reinterpret_cast<float4 *>(dst)[i] = reinterpret_cast<const float4 *>(src)[i];
  } else {
    for (int i = threadIdx.x; i < count; i += blockDim.x)
      dst[i] = src[i];
  }
}

/// A block per chunk: P [c][c] of x, y, G [c][dk]. A warp per pair (t, i),
/// its lanes over the channels.
__global__ void __launch_bounds__(kThreads)
    perChannelScoresKernel(const float *x, const float *y, const float *cum, int chunk, int channels, float *out) {
  extern __shared__ __align__(16) float smem[];
  float *xs = smem, *ys = xs + chunk * channels, *gs = ys + chunk * channels;
  const int64_t item = blockIdx.x, base = item * chunk * channels;
  copyFloats(xs, x + base, chunk * channels);
  copyFloats(ys, y + base, chunk * channels);
  copyFloats(gs, cum + base, chunk * channels);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float *o = out + item * chunk * chunk;
  for (int pair = warp; pair < chunk * chunk; pair += warps) {
    const int t = pair / chunk, i = pair % chunk;
    float sum = 0.0f;
    if (i <= t)
      for (int d = lane; d < channels; d += 32)
        sum += xs[t * channels + d] * ys[i * channels + d] * __expf(gs[t * channels + d] - gs[i * channels + d]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0)
      o[pair] = sum;
  }
}

/// A block per chunk, as perChannelScoresKernel, but a thread per pair
/// (t, i <= t) summing over the channels in registers: no cross-lane
/// reduction and no warps idle above the diagonal (the warp-per-pair form
/// spent 3.1 ms a call at 1 x 32 heads x 8K on the H200, the backward, which
/// needs no reduction, 1.3 ms for two outputs). Rows sit in shared memory
/// with a stride of channels + 1 floats: a warp's pairs are mostly one query
/// row (a broadcast) against consecutive key rows, which then fall in
/// distinct banks. The default since the `kimi_scores` and
/// `kimi_delta.*` op checks passed with it on an H100 (session 44);
/// ADAPT_KIMI_SCORES_PAIRS=0 takes the warp-per-pair form.
__global__ void __launch_bounds__(kThreads)
    perChannelScoresPairsKernel(const float *x, const float *y, const float *cum, int chunk, int channels,
                                float *out) {
  extern __shared__ __align__(16) float smem[];
  const int stride = channels + 1;
  float *xs = smem, *ys = xs + chunk * stride, *gs = ys + chunk * stride;
  const int64_t item = blockIdx.x, base = item * chunk * channels;
  for (int e = threadIdx.x; e < chunk * channels; e += blockDim.x) {
    const int r = e / channels, d = e % channels;
    xs[r * stride + d] = x[base + e];
    ys[r * stride + d] = y[base + e];
    gs[r * stride + d] = cum[base + e];
  }
  __syncthreads();
  float *o = out + item * chunk * chunk;
  const int pairs = chunk * (chunk + 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    // Pair p of the lower triangle, row by row: t(t + 1)/2 <= p < (t + 1)(t + 2)/2.
    int t = static_cast<int>((sqrtf(8.0f * static_cast<float>(p) + 1.0f) - 1.0f) * 0.5f);
    while (t * (t + 1) / 2 > p)
      --t;
    while ((t + 1) * (t + 2) / 2 <= p)
      ++t;
    const int i = p - t * (t + 1) / 2;
    const float *xt = xs + t * stride, *gt = gs + t * stride, *yi = ys + i * stride, *gi = gs + i * stride;
    float sum = 0.0f;
    for (int d = 0; d < channels; ++d)
      sum += xt[d] * yi[d] * __expf(gt[d] - gi[d]);
    o[t * chunk + i] = sum;
  }
  for (int p = threadIdx.x; p < chunk * chunk; p += blockDim.x)
    if (p % chunk > p / chunk)
      o[p] = 0.0f;
}

constexpr int kPairedThreads = 512;

/// The backward kernels' operands of chunk \p item in shared memory: x (and
/// with \p Paired the second x), y and G [c][dk], the cotangents [c][c];
/// \p end is the first float after them.
struct BackwardTiles {
  float *xa, *xb, *y, *g, *pa, *pb, *end;
};

/// Fills BackwardTiles from \p smem (behind the caller's barrier): x, y
/// (and the second x) from \p keys when it holds bf16 rows.
template <bool Paired>
__device__ BackwardTiles loadBackwardTiles(float *smem, const float *gradA, const float *xA, const float *gradB,
                                           const float *xB, const float *y, const float *cum, int chunk, int channels,
                                           int64_t item, const Bf16Keys &keys) {
  const int tile = chunk * channels;
  BackwardTiles s;
  s.xa = smem, s.xb = s.xa + (Paired ? tile : 0), s.y = s.xb + tile, s.g = s.y + tile;
  s.pa = s.g + tile, s.pb = s.pa + (Paired ? chunk * chunk : 0), s.end = s.pb + chunk * chunk;
  const int64_t base = item * tile;
  if (keys.key) {
    widenRows(s.xa, keys.query + base, tile, channels, keys.queryScale, nullptr);
    widenRows(s.y, keys.key + base, tile, channels, 1.0f, nullptr);
    if constexpr (Paired)
      widenRows(s.xb, keys.key + base, tile, channels, 1.0f, keys.beta + item * chunk);
  } else {
    copyFloats(s.xa, xA + base, tile);
    copyFloats(s.y, y + base, tile);
    if constexpr (Paired)
      copyFloats(s.xb, xB + base, tile);
  }
  copyFloats(s.g, cum + base, tile);
  copyFloats(s.pa, gradA + item * chunk * chunk, chunk * chunk);
  if constexpr (Paired)
    copyFloats(s.pb, gradB + item * chunk * chunk, chunk * chunk);
  return s;
}

/// dy_r's pairwise terms at channel \p d: sum over queries r <= t < \p endQuery
/// of (gA_tr xA_t + gB_tr xB_t) e^{G_t - G_r}, an exponential each (both
/// backward kernels; the sub-chunk one over the diagonal block only).
template <bool Paired>
__device__ __forceinline__ float queriesTerm(const BackwardTiles &s, int r, int d, int endQuery, int chunk,
                                             int channels, float gr) {
  float dy = 0.0f;
  for (int t = r; t < endQuery; ++t) {
    float term = s.pa[t * chunk + r] * s.xa[t * channels + d];
    if constexpr (Paired)
      term += s.pb[t * chunk + r] * s.xb[t * channels + d];
    dy += term * __expf(s.g[t * channels + d] - gr);
  }
  return dy;
}

/// A block per chunk: dx and dy [c][dk] from g [c][c]. A thread per
/// (channel, row), rows strided by blockDim / channels; g's row is the same
/// across a warp (a broadcast read), the channels consecutive. With
/// \p Paired, two cotangents that share y and G (Kimi's backward: the
/// output scores' with x = the query, the system's with x = beta k): dxA,
/// dxB and dy = dyA + dyB from one exponential per (row, key, channel)
/// where two launches take two; 160 KiB of shared memory at c 64, dk 128.
/// Unpaired, the B operands are unused (null).
template <bool Paired>
__global__ void __launch_bounds__(Paired ? kPairedThreads : kThreads)
    perChannelScoresBackwardKernel(const float *gradA, const float *xA, const float *gradB, const float *xB,
                                   const float *y, const float *cum, int chunk, int channels, float *gradXA,
                                   float *gradXB, float *gradY, Bf16Keys keys) {
  extern __shared__ __align__(16) float smem[];
  const BackwardTiles s = loadBackwardTiles<Paired>(smem, gradA, xA, gradB, xB, y, cum, chunk, channels, blockIdx.x, keys);
  const float *ys = s.y, *gs = s.g, *pa = s.pa, *pb = s.pb;
  const int64_t base = int64_t(blockIdx.x) * chunk * channels;
  __syncthreads();
  const int rowsAtOnce = blockDim.x / channels, d = threadIdx.x % channels;
  if (threadIdx.x >= rowsAtOnce * channels)
    return;
  for (int r = threadIdx.x / channels; r < chunk; r += rowsAtOnce) {
    const float gr = gs[r * channels + d];
    float dxa = 0.0f, dxb = 0.0f, dy = 0.0f;
    for (int i = 0; i <= r; ++i) { // dx_r: keys i <= r
      const float ye = ys[i * channels + d] * __expf(gr - gs[i * channels + d]);
      dxa += pa[r * chunk + i] * ye;
      if constexpr (Paired)
        dxb += pb[r * chunk + i] * ye;
    }
    dy += queriesTerm<Paired>(s, r, d, chunk, chunk, channels, gr); // dy_r: queries t >= r
    gradXA[base + r * channels + d] = dxa;
    if constexpr (Paired)
      gradXB[base + r * channels + d] = dxb;
    gradY[base + r * channels + d] = dy;
  }
}

//===--- Sub-chunks of 16: exponentials only on the diagonal blocks ------===//
//
// Split the chunk into blocks of kSub rows. Where query t is in block a and
// key i in an earlier block (i < a0, a0 = a's first row),
//   e^{G_td - G_id} = e^{G_td - G_a0d} e^{G_a0d - G_id},
// both exponents <= 0 (G falls down the chunk), so the block (a, earlier) of
// P is a plain product of x scaled to a0 and y scaled to a0: one exponential
// per (row, channel) instead of one per (row, key, channel). Only the
// diagonal blocks keep an exponential per term, as fla's KDA does. The
// product of two factors <= 1 equals the single exponential to a few ulps;
// where a factor underflows the exact term is smaller still.
// The default since the `kimi_scores` and `kimi_delta.*` op checks and
// memcheck passed with them on an H100 (session 49; KDA forward + backward
// 11.48 -> 10.84 ms at 8K, 46.37 -> 43.85 at 32K);
// ADAPT_KIMI_SCORES_SUBCHUNKS=0 keeps the thread-per-pair kernels.

constexpr int kDiagonalParts = 8;      ///< Lanes that share a row's channels in the diagonal pass.
constexpr int kSubchunkThreads = 512; ///< The forward's threads: kDiagonalParts per row at 64 rows.

/// The index of block pair (a, b), b < a, in the forward's table of
/// per-channel factors e^{G_a0 - G_bEnd}: 0 .. 5 at four blocks.
__host__ __device__ constexpr int blockPair(int a, int b) { return a * (a - 1) / 2 + b; }

/// Copies the [rows][channels] tile at \p src into \p dst with row stride
/// \p stride, 16-byte loads where \p channels allows, several in flight.
__device__ __forceinline__ void loadPadded(float *dst, const float *src, int rows, int channels, int stride) {
  if (channels % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const int perRow = channels / 4;
#pragma unroll 4
    for (int e = threadIdx.x; e < rows * perRow; e += blockDim.x) {
      const float4 v = __ldg(reinterpret_cast<const float4 *>(src) + e);
      float *o = dst + (e / perRow) * stride + (e % perRow) * 4;
      o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    }
  } else {
    for (int e = threadIdx.x; e < rows * channels; e += blockDim.x)
      dst[(e / channels) * stride + e % channels] = __ldg(src + e);
  }
}

/// A block per chunk, kSubchunkThreads threads, two blocks an SM: P [c][c]
/// as perChannelScoresPairsKernel. Below the diagonal the rows are scaled
/// in place, queries to their block's first row (x_t e^{G_t - G_a0}) and
/// keys to their block's last (y_i e^{G_bEnd - G_i}), and block (a, b)
/// is their product through the table e^{G_a0 - G_bEnd}: three factors
/// <= 1 whose product is e^{G_t - G_i}.
__global__ void __launch_bounds__(kSubchunkThreads, 2)
    perChannelScoresSubchunkKernel(const float *x, const float *y, const float *cum, int chunk, int channels,
                                   float *out) {
  extern __shared__ __align__(16) float smem[];
  const int stride = channels + 1; // rows in distinct banks for the product pass
  float *xs = smem, *ys = xs + chunk * stride, *gs = ys + chunk * stride, *between = gs + chunk * stride;
  const int64_t item = blockIdx.x, base = item * chunk * channels;
  loadPadded(xs, x + base, chunk, channels, stride);
  loadPadded(ys, y + base, chunk, channels, stride);
  loadPadded(gs, cum + base, chunk, channels, stride);
  float *o = out + item * chunk * chunk;
  for (int p = threadIdx.x; p < chunk * chunk; p += blockDim.x)
    if (p % chunk > p / chunk)
      o[p] = 0.0f;
  __syncthreads();
  // The diagonal blocks: kDiagonalParts consecutive lanes per query row t,
  // each over channels part, part + 8, ...; x_t and G_t held in registers
  // across the keys i in [a0, t]; the parts' sums meet by shuffles.
  const int part = threadIdx.x % kDiagonalParts;
  const unsigned group = 0xffu << (threadIdx.x % 32 / kDiagonalParts * kDiagonalParts);
  constexpr int kPerPart = kMaxChannels / kDiagonalParts;
  for (int t = threadIdx.x / kDiagonalParts; t < chunk; t += blockDim.x / kDiagonalParts) {
    float xt[kPerPart], gt[kPerPart];
#pragma unroll
    for (int k = 0; k < kPerPart; ++k) {
      const int d = part + k * kDiagonalParts;
      xt[k] = d < channels ? xs[t * stride + d] : 0.0f;
      gt[k] = d < channels ? gs[t * stride + d] : 0.0f;
    }
    for (int i = t / kSub * kSub; i <= t; ++i) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kPerPart; ++k) {
        const int d = part + k * kDiagonalParts;
        if (d < channels)
          sum += xt[k] * ys[i * stride + d] * __expf(gt[k] - gs[i * stride + d]);
      }
#pragma unroll
      for (int offset = kDiagonalParts / 2; offset > 0; offset >>= 1)
        sum += __shfl_xor_sync(group, sum, offset);
      if (part == 0)
        o[t * chunk + i] = sum;
    }
  }
  __syncthreads(); // the diagonal pass read the unscaled rows
  const int blocks = (chunk + kSub - 1) / kSub;
  for (int e = threadIdx.x; e < chunk * channels; e += blockDim.x) {
    const int t = e / channels, d = e % channels, a0 = t / kSub * kSub;
    const float g = gs[t * stride + d];
    if (a0 > 0) // a query of a block with blocks before it
      xs[t * stride + d] *= __expf(g - gs[a0 * stride + d]);
    if (a0 + kSub < chunk) // a key of a block with blocks after it
      ys[t * stride + d] *= __expf(gs[(a0 + kSub - 1) * stride + d] - g);
  }
  for (int e = threadIdx.x; e < blockPair(blocks, 0) * channels; e += blockDim.x) {
    const int pair = e / channels, d = e % channels;
    int a = 1;
    while (blockPair(a + 1, 0) <= pair)
      ++a;
    const int b = pair - blockPair(a, 0);
    between[e] = __expf(gs[a * kSub * stride + d] - gs[(b * kSub + kSub - 1) * stride + d]);
  }
  __syncthreads();
  // Below the diagonal: each half of the block takes block rows, the first
  // the last one (a key blocks a thread), the second the others, from
  // a - 1 down (at 64 rows: 3 against 2 + 1); a thread per (row, column q
  // of 16), the keys q, q + 16, ... < a0.
  const int half = threadIdx.x / (kSubchunkThreads / 2), unit = threadIdx.x % (kSubchunkThreads / 2), q = unit % kSub;
  for (int a = blocks - 1 - half; a >= 1; a = half == 0 ? 0 : a - 1) {
    const int t = a * kSub + unit / kSub;
    if (t >= chunk)
      continue;
    const float *factors = between + blockPair(a, 0) * channels;
    float sums[kMaxChunk / kSub - 1] = {};
    for (int d = 0; d < channels; ++d) {
      const float xv = xs[t * stride + d];
#pragma unroll
      for (int b = 0; b < kMaxChunk / kSub - 1; ++b)
        if (b < a)
          sums[b] += xv * factors[b * channels + d] * ys[(b * kSub + q) * stride + d];
    }
#pragma unroll
    for (int b = 0; b < kMaxChunk / kSub - 1; ++b)
      if (b < a)
        o[t * chunk + b * kSub + q] = sums[b];
  }
}

constexpr int kRowsPerThread = 4; ///< Consecutive rows a thread of the row-block backward takes.

/// A block per chunk: dx and dy [c][dk] from g [c][c] as
/// perChannelScoresBackwardKernel (\p Paired for two cotangents sharing y
/// and G), the blocks below the diagonal through scaled rows: dx_t gains
/// e^{G_t - G_a0} sum_{i < a0} g_ti yhat_i, and dy_i gains, for each later
/// block row a, e^{G_a0 - G_i} sum_{t in a} g_ti xhat_t. dy's diagonal part
/// goes to memory first and its thread adds the rest (each element has one
/// writer).
/// Each thread takes kRowsPerThread consecutive rows r0 .. r0 + 3 (within
/// one block of kSub) of one channel: each shared-memory read of a key,
/// query or decay row feeds four rows' sums, and g's four rows (or,
/// transposed, four columns) arrive as float4s. A thread per (row, channel)
/// read about six shared words for every eight multiply-adds below the
/// diagonal (a load-bound loop at 25 % occupancy: 1.96 ms of KDA's step at
/// 1 x 32 x 8K on an H100); here twelve for 32, and the kernel takes
/// 1.65 ms (session 54). Rows are grouped so that at dk 128 each thread
/// gets one group in every block row (the same work per thread).
template <bool Paired>
__global__ void __launch_bounds__(Paired ? kPairedThreads : kThreads, 1)
    perChannelScoresSubchunkBackwardKernel(const float *gradA, const float *xA, const float *gradB, const float *xB,
                                           const float *y, const float *cum, int chunk, int channels, float *gradXA,
                                           float *gradXB, float *gradY, Bf16Keys keys) {
  constexpr int R = kRowsPerThread;
  extern __shared__ __align__(16) float smem[];
  const BackwardTiles s = loadBackwardTiles<Paired>(smem, gradA, xA, gradB, xB, y, cum, chunk, channels, blockIdx.x, keys);
  float *xas = s.xa, *xbs = s.xb, *yhat = s.end;
  const float *ys = s.y, *gs = s.g, *pa = s.pa, *pb = s.pb;
  const int64_t base = int64_t(blockIdx.x) * chunk * channels;
  __syncthreads();
  scaleKeysToBlockRows(ys, gs, channels, chunk, channels, yhat);
  __syncthreads();
  const int slots = blockDim.x / channels, d = threadIdx.x % channels, groups = (chunk + R - 1) / R;
  const bool active = threadIdx.x < slots * channels;
  const bool wide = chunk % 4 == 0; // g's rows and columns four at a time (every group then has R rows)
  for (int group = threadIdx.x / channels; active && group < groups; group += slots) {
    const int r0 = group * R, rows = min(R, chunk - r0), a0 = r0 / kSub * kSub, end = min(a0 + kSub, chunk);
    float gr[R], dxa[R] = {}, dxb[R] = {}, dy[R] = {};
#pragma unroll
    for (int j = 0; j < R; ++j)
      gr[j] = j < rows ? gs[(r0 + j) * channels + d] : 0.0f;
    for (int i = a0; i < r0 + rows; ++i) { // dx's diagonal block: keys a0 <= i <= r
      const float yi = ys[i * channels + d], gi = gs[i * channels + d];
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (j < rows && i <= r0 + j) {
          const float ye = yi * __expf(gr[j] - gi);
          dxa[j] += pa[(r0 + j) * chunk + i] * ye;
          if constexpr (Paired)
            dxb[j] += pb[(r0 + j) * chunk + i] * ye;
        }
    }
    if (a0 > 0) { // dx's earlier blocks, through the keys scaled to a0
      const float *keys = yhat + scaledKeysRow(a0 / kSub) * channels;
      float sa[R] = {}, sb[R] = {};
      if (wide) {
        for (int i = 0; i < a0; i += 4) {
          const float k0 = keys[i * channels + d], k1 = keys[(i + 1) * channels + d];
          const float k2 = keys[(i + 2) * channels + d], k3 = keys[(i + 3) * channels + d];
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const float4 ga = *reinterpret_cast<const float4 *>(pa + (r0 + j) * chunk + i);
            sa[j] += ga.x * k0 + ga.y * k1 + ga.z * k2 + ga.w * k3;
            if constexpr (Paired) {
              const float4 gb = *reinterpret_cast<const float4 *>(pb + (r0 + j) * chunk + i);
              sb[j] += gb.x * k0 + gb.y * k1 + gb.z * k2 + gb.w * k3;
            }
          }
        }
      } else {
        for (int i = 0; i < a0; ++i) {
          const float k = keys[i * channels + d];
#pragma unroll
          for (int j = 0; j < R; ++j)
            if (j < rows) {
              sa[j] += pa[(r0 + j) * chunk + i] * k;
              if constexpr (Paired)
                sb[j] += pb[(r0 + j) * chunk + i] * k;
            }
        }
      }
      const float ga0 = gs[a0 * channels + d];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const float back = __expf(gr[j] - ga0);
        dxa[j] += back * sa[j];
        dxb[j] += back * sb[j];
      }
    }
    for (int t = r0; t < end; ++t) { // dy's diagonal block: queries r <= t < end
      const float xa = xas[t * channels + d], xb = Paired ? xbs[t * channels + d] : 0.0f, gt = gs[t * channels + d];
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (j < rows && t >= r0 + j) {
          float term = pa[t * chunk + r0 + j] * xa;
          if constexpr (Paired)
            term += pb[t * chunk + r0 + j] * xb;
          dy[j] += term * __expf(gt - gr[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < rows) {
        const int64_t at = base + (r0 + j) * channels + d;
        gradXA[at] = dxa[j];
        if constexpr (Paired)
          gradXB[at] = dxb[j];
        gradY[at] = dy[j];
      }
  }
  __syncthreads(); // the diagonal pass read the unscaled queries
  scaleRowsToBlockStart(xas, gs, channels, chunk, channels);
  if constexpr (Paired)
    scaleRowsToBlockStart(xbs, gs, channels, chunk, channels);
  __syncthreads();
  const int blocks = (chunk + kSub - 1) / kSub;
  for (int group = threadIdx.x / channels; active && group < groups; group += slots) {
    const int r0 = group * R, rows = min(R, chunk - r0), blockOfR = r0 / kSub;
    if (blockOfR + 1 >= blocks)
      continue;
    float gr[R], dy[R] = {};
#pragma unroll
    for (int j = 0; j < R; ++j)
      gr[j] = j < rows ? gs[(r0 + j) * channels + d] : 0.0f;
    for (int a = blockOfR + 1; a < blocks; ++a) { // later block rows: queries scaled to a0
      const int a0 = a * kSub, end = min(a0 + kSub, chunk);
      float sum[R] = {};
      for (int t = a0; t < end; ++t) {
        const float xa = xas[t * channels + d], xb = Paired ? xbs[t * channels + d] : 0.0f;
        if (wide) {
          const float4 ga = *reinterpret_cast<const float4 *>(pa + t * chunk + r0);
          const float gav[R] = {ga.x, ga.y, ga.z, ga.w};
          float gbv[R] = {};
          if constexpr (Paired) {
            const float4 gb = *reinterpret_cast<const float4 *>(pb + t * chunk + r0);
            gbv[0] = gb.x, gbv[1] = gb.y, gbv[2] = gb.z, gbv[3] = gb.w;
          }
#pragma unroll
          for (int j = 0; j < R; ++j) {
            sum[j] += gav[j] * xa;
            if constexpr (Paired)
              sum[j] += gbv[j] * xb;
          }
        } else {
#pragma unroll
          for (int j = 0; j < R; ++j)
            if (j < rows) {
              sum[j] += pa[t * chunk + r0 + j] * xa;
              if constexpr (Paired)
                sum[j] += pb[t * chunk + r0 + j] * xb;
            }
        }
      }
      const float ga0 = gs[a0 * channels + d];
#pragma unroll
      for (int j = 0; j < R; ++j)
        dy[j] += __expf(ga0 - gr[j]) * sum[j];
    }
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < rows) // a reduction without a return: no wait on the row written above
        atomicAdd(gradY + base + (r0 + j) * channels + d, dy[j]);
  }
}

/// Whether x, y and cum are alike: CUDA fp32 [.., c, dk] with c <= 64, dk in [32, 128].
bool chunkOperands(const at::Tensor &x, const at::Tensor &y, const at::Tensor &cum) {
  if (!x.is_cuda() || x.dim() < 2 || x.scalar_type() != at::kFloat)
    return false;
  for (const at::Tensor *t : {&y, &cum})
    if (t->device() != x.device() || t->scalar_type() != at::kFloat || t->sizes() != x.sizes())
      return false;
  const int64_t c = x.size(-2), dk = x.size(-1);
  return c >= 1 && c <= kMaxChunk && dk >= 32 && dk <= kMaxChannels && x.numel() / (c * dk) <= INT32_MAX;
}

/// Allows \p kernel \p bytes of dynamic shared memory (above 48 KiB).
template <typename Kernel> void allowBytes(Kernel kernel, size_t bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

} // namespace

bool perChannelScoresKernelEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_SCORES_KERNEL");
  return on;
}

bool perChannelScoresTakes(const at::Tensor &x, const at::Tensor &y, const at::Tensor &cum) {
  return chunkOperands(x, y, cum);
}

bool scoresSubchunksEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_SCORES_SUBCHUNKS");
  return on;
}

bool pairedScoresBackwardEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_SCORES_PAIRED_BACKWARD");
  return on;
}

at::Tensor perChannelScores(const at::Tensor &xIn, const at::Tensor &yIn, const at::Tensor &cumIn) {
  TORCH_CHECK(chunkOperands(xIn, yIn, cumIn), "perChannelScores: expected CUDA fp32 x, y, cum [.., c <= 64, 32 <= dk <= 128]");
  const at::Tensor x = xIn.contiguous(), y = yIn.contiguous(), cum = cumIn.contiguous();
  const int chunk = static_cast<int>(x.size(-2)), channels = static_cast<int>(x.size(-1));
  const int64_t items = x.numel() / (int64_t(chunk) * channels);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(chunk);
  at::Tensor out = at::empty(shape, x.options());
  if (items == 0)
    return out;
  const c10::cuda::CUDAGuard guard(x.device());
  static const bool pairs = !switchedOff("ADAPT_KIMI_SCORES_PAIRS");
  const bool subchunks = scoresSubchunksEnabled();
  const auto kernel = subchunks ? perChannelScoresSubchunkKernel : pairs ? perChannelScoresPairsKernel : perChannelScoresKernel;
  const size_t bytes = (3 * size_t(chunk) * (channels + (pairs || subchunks ? 1 : 0)) +
                        (subchunks ? size_t(blockPair((chunk + kSub - 1) / kSub, 0)) * channels : 0)) *
                       sizeof(float);
  allowBytes(kernel, bytes);
  kernel<<<static_cast<unsigned>(items), subchunks ? kSubchunkThreads : kThreads, bytes,
           at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), cum.data_ptr<float>(), chunk,
                                               channels, out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::pair<at::Tensor, at::Tensor> perChannelScoresBackward(const at::Tensor &grad, const at::Tensor &xIn,
                                                           const at::Tensor &yIn, const at::Tensor &cumIn) {
  TORCH_CHECK(chunkOperands(xIn, yIn, cumIn),
              "perChannelScoresBackward: expected CUDA fp32 x, y, cum [.., c <= 64, 32 <= dk <= 128]");
  const at::Tensor x = xIn.contiguous(), y = yIn.contiguous(), cum = cumIn.contiguous();
  const int chunk = static_cast<int>(x.size(-2)), channels = static_cast<int>(x.size(-1));
  const int64_t items = x.numel() / (int64_t(chunk) * channels);
  at::Tensor g = grad.to(at::kFloat).contiguous();
  TORCH_CHECK(g.numel() == items * chunk * chunk && g.device() == x.device(),
              "perChannelScoresBackward: expected a cotangent [.., c, c] beside x");
  at::Tensor dx = at::empty_like(x), dy = at::empty_like(y);
  if (items == 0)
    return {dx, dy};
  const c10::cuda::CUDAGuard guard(x.device());
  const bool subchunks = scoresSubchunksEnabled();
  const auto kernel = subchunks ? perChannelScoresSubchunkBackwardKernel<false> : perChannelScoresBackwardKernel<false>;
  const size_t bytes = (3 * size_t(chunk) * channels + size_t(chunk) * chunk +
                        (subchunks ? size_t(scaledKeysRow((chunk + kSub - 1) / kSub)) * channels : 0)) *
                       sizeof(float);
  allowBytes(kernel, bytes);
  kernel<<<static_cast<unsigned>(items), kThreads, bytes, at::cuda::getCurrentCUDAStream()>>>(
      g.data_ptr<float>(), x.data_ptr<float>(), nullptr, nullptr, y.data_ptr<float>(), cum.data_ptr<float>(), chunk,
      channels, dx.data_ptr<float>(), nullptr, dy.data_ptr<float>(), Bf16Keys{});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dx, dy};
}

namespace {

/// The paired backward kernel over the chunks of \p cum (contiguous) for
/// the cotangents \p gradA and \p gradB: fp32 \p xA, \p xB and \p y
/// (contiguous, like cum), or null with \p keys' bf16 rows. \p caller
/// names the entry point in errors.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pairedBackward(const at::Tensor &gradA, const at::Tensor &gradB,
                                                              const float *xA, const float *xB, const float *y,
                                                              const at::Tensor &cum, const Bf16Keys &keys,
                                                              const char *caller) {
  const int chunk = static_cast<int>(cum.size(-2)), channels = static_cast<int>(cum.size(-1));
  const int64_t items = cum.numel() / (int64_t(chunk) * channels);
  const at::Tensor ga = gradA.to(at::kFloat).contiguous(), gb = gradB.to(at::kFloat).contiguous();
  TORCH_CHECK(ga.numel() == items * chunk * chunk && gb.numel() == ga.numel() && ga.device() == cum.device() &&
                  gb.device() == cum.device(),
              caller, ": expected two cotangents [.., c, c] beside the keys");
  at::Tensor dxA = at::empty_like(cum), dxB = at::empty_like(cum), dy = at::empty_like(cum);
  if (items == 0)
    return {dxA, dxB, dy};
  const c10::cuda::CUDAGuard guard(cum.device());
  const bool subchunks = scoresSubchunksEnabled();
  if (subchunks && pairedScoresMmaEnabled() &&
      pairedScoresMmaTakes(chunk, channels, keys, ga.data_ptr<float>(), gb.data_ptr<float>(), cum.data_ptr<float>())) {
    pairedScoresMmaBackward(ga.data_ptr<float>(), gb.data_ptr<float>(), keys, cum.data_ptr<float>(), items,
                            dxA.data_ptr<float>(), dxB.data_ptr<float>(), dy.data_ptr<float>(),
                            at::cuda::getCurrentCUDAStream());
    return {dxA, dxB, dy};
  }
  const auto kernel = subchunks ? perChannelScoresSubchunkBackwardKernel<true> : perChannelScoresBackwardKernel<true>;
  const size_t bytes = (4 * size_t(chunk) * channels + 2 * size_t(chunk) * chunk +
                        (subchunks ? size_t(scaledKeysRow((chunk + kSub - 1) / kSub)) * channels : 0)) *
                       sizeof(float);
  allowBytes(kernel, bytes);
  kernel<<<static_cast<unsigned>(items), kPairedThreads, bytes, at::cuda::getCurrentCUDAStream()>>>(
      ga.data_ptr<float>(), xA, gb.data_ptr<float>(), xB, y, cum.data_ptr<float>(), chunk, channels,
      dxA.data_ptr<float>(), dxB.data_ptr<float>(), dy.data_ptr<float>(), keys);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dxA, dxB, dy};
}

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> perChannelScoresPairedBackward(const at::Tensor &gradA, const at::Tensor &xAIn,
                                                    const at::Tensor &gradB, const at::Tensor &xBIn,
                                                    const at::Tensor &yIn, const at::Tensor &cumIn) {
  TORCH_CHECK(chunkOperands(xAIn, yIn, cumIn) && chunkOperands(xBIn, yIn, cumIn),
              "perChannelScoresPairedBackward: expected CUDA fp32 xA, xB, y, cum [.., c <= 64, 32 <= dk <= 128]");
  const at::Tensor xA = xAIn.contiguous(), xB = xBIn.contiguous(), y = yIn.contiguous(), cum = cumIn.contiguous();
  return pairedBackward(gradA, gradB, xA.data_ptr<float>(), xB.data_ptr<float>(), y.data_ptr<float>(), cum,
                        Bf16Keys{}, "perChannelScoresPairedBackward");
}

bool pairedScoresBf16KeysTake(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                              const at::Tensor &cum) {
  if (!cum.is_cuda() || cum.dim() < 2 || cum.scalar_type() != at::kFloat)
    return false;
  for (const at::Tensor *t : {&query, &key})
    if (t->device() != cum.device() || t->scalar_type() != at::kBFloat16 || t->sizes() != cum.sizes())
      return false;
  const int64_t c = cum.size(-2), dk = cum.size(-1);
  return c >= 1 && c <= kMaxChunk && dk >= 32 && dk <= kMaxChannels && dk % 4 == 0 &&
         cum.numel() / (c * dk) <= INT32_MAX && beta.device() == cum.device() && beta.scalar_type() == at::kFloat &&
         beta.numel() * dk == cum.numel();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> perChannelScoresPairedBackwardBf16Keys(
    const at::Tensor &gradA, const at::Tensor &gradB, const at::Tensor &queryIn, const at::Tensor &keyIn,
    const at::Tensor &betaIn, const at::Tensor &cumIn, double queryScale) {
  TORCH_CHECK(pairedScoresBf16KeysTake(queryIn, keyIn, betaIn, cumIn),
              "perChannelScoresPairedBackwardBf16Keys: expected CUDA bf16 q, k and fp32 cum alike [.., c <= 64, "
              "32 <= dk <= 128, dk % 4 == 0] and fp32 beta [.., c, 1]");
  const at::Tensor query = queryIn.contiguous(), key = keyIn.contiguous(), beta = betaIn.contiguous(),
                   cum = cumIn.contiguous();
  const auto rows = [](const at::Tensor &x) { return reinterpret_cast<const __nv_bfloat16 *>(x.data_ptr<at::BFloat16>()); };
  const Bf16Keys keys{rows(query), rows(key), beta.data_ptr<float>(), static_cast<float>(queryScale)};
  return pairedBackward(gradA, gradB, nullptr, nullptr, nullptr, cum, keys, "perChannelScoresPairedBackwardBf16Keys");
}

} // namespace adapt::rt::cuda
