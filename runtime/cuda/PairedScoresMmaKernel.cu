//===- PairedScoresMmaKernel.cu - Kimi's paired score gradients, TF32 MMA -===//
//
// The paired backward of Kimi delta attention's per-channel scores
// (PerChannelScoresKernel.cu has the sums and the scalar kernels) for
// chunks of 64 tokens and 128 key channels with bf16 q and k. Split into
// four blocks of 16 rows, the blocks below the diagonal are plain matrix
// products once the keys are scaled to the query block's first row (dx)
// and the queries to their own block's first row (dy):
//   dxA_a += e^{G_r - G_a0} gA [a, < a0] yhat_a   (dxB_a alike with gB),
//   dy_b  += sum_{a > b} e^{G_a0 - G_r} (gA [a, b]^T xhatA_a + gB [a, b]^T xhatB_a).
// By a count of its loops, the scalar kernel spends about half its
// shared-memory reads and most of its multiply-adds on them (1.59 ms of KDA's 6.69 at 1 x 32 x 8K on an
// H100, session 56); here they are TF32 tensor-core tiles (mma.sync m16n8k8,
// fp32 accumulation; fla's Triton kernels take the same products as
// tl.dot, TF32 on Hopper). TF32 rounds each factor to 11 significant bits,
// finer than the bf16 q and k they come from; the fp32 path keeps the
// scalar kernel. The diagonal blocks keep an exponential per term, as there.
// On an H100 at 1 x 32 x 8K (session 57): 1.59 -> 1.20 ms, KDA forward +
// backward 6.65 -> 6.26 ms; `kimi_scores.paired_backward_rows` 9.6e-5 (the
// scalar kernel 9.4e-8, the bf16 bound 2.5e-2), Kimi's bf16 checks unchanged.
//
// One block of 512 threads per chunk, sixteen warps: warp w takes block row
// a = w / 4 and output columns 32 (w % 4) .. + 31 in both products (dx's
// depth grows with a, dy's shrinks: 48 rows of depth each in all). Tiles
// are padded (rows of 136 and 68 floats) so that the fragments' reads fall
// in distinct banks.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/Mma.cuh"
#include "runtime/cuda/PerChannelScores.cuh"
#include "runtime/cuda/Switches.h"

#include <c10/cuda/CUDAException.h>

namespace adapt::rt::cuda::scores {

namespace {

constexpr int kChunk = 64;                        ///< Tokens per chunk.
constexpr int kChannels = 128;                    ///< Key channels.
constexpr int kBlocks = kChunk / kSub;            ///< Blocks of 16 rows.
constexpr int kRow = kChannels + 8;               ///< Row stride of the [64][128] tiles (banks 8 apart).
constexpr int kGradRow = kChunk + 4;              ///< Row stride of the cotangents (banks 4 apart).
constexpr int kThreads = 512;                     ///< Sixteen warps.
constexpr int kQuarter = kChannels / 4;           ///< Output columns of one warp.
constexpr int kTiles = kQuarter / 8;              ///< m16n8 tiles across a warp's columns.
constexpr int kScaledRows = scaledKeysRow(kBlocks); ///< yhat's rows (96), also dx's staging.
constexpr int kRowsPerThread = 4;                 ///< Rows a thread takes in the diagonal pass.

/// Shared floats: x A, x B, y, G, yhat (each row kRow) and two cotangents (kGradRow).
constexpr size_t kSharedFloats = (4 * kChunk + kScaledRows) * size_t(kRow) + 2 * kChunk * size_t(kGradRow);

/// Loads a [64][128] row block of bf16 \p src into \p dst (row stride
/// kRow) widened and times \p scale, or times \p rowScale[row] when given.
__device__ __forceinline__ void widenPadded(float *dst, const __nv_bfloat16 *src, float scale, const float *rowScale) {
  for (int i = threadIdx.x; i < kChunk * kChannels / 4; i += blockDim.x) {
    const int row = 4 * i / kChannels, col = 4 * i % kChannels;
    const uint2 raw = reinterpret_cast<const uint2 *>(src)[i];
    const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
    const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
    const float f = rowScale ? rowScale[row] : scale;
    *reinterpret_cast<float4 *>(dst + row * kRow + col) = make_float4(low.x * f, low.y * f, high.x * f, high.y * f);
  }
}

/// Copies \p rows rows of \p width floats (a multiple of 4, \p src 16-byte
/// aligned) into \p dst with row stride \p stride.
__device__ __forceinline__ void copyPadded(float *dst, const float *src, int rows, int width, int stride) {
  for (int i = threadIdx.x; i < rows * width / 4; i += blockDim.x) {
    const int row = 4 * i / width, col = 4 * i % width;
    *reinterpret_cast<float4 *>(dst + row * stride + col) = __ldg(reinterpret_cast<const float4 *>(src) + i);
  }
}

/// The four A registers of a 16 x 8 TF32 tile at rows m0.., columns k0.. of
/// the row-major \p tile (row stride \p stride); transposed (\p Transposed)
/// the tile holds A^T, element (m, k) at tile[k][m].
template <bool Transposed>
__device__ __forceinline__ void loadTf32A(uint32_t (&a)[4], const float *tile, int stride, int m0, int k0, int g,
                                          int t) {
  const auto at = [&](int m, int k) {
    return toTf32(Transposed ? tile[(k0 + k) * stride + m0 + m] : tile[(m0 + m) * stride + k0 + k]);
  };
  a[0] = at(g, t), a[1] = at(g + 8, t), a[2] = at(g, t + 4), a[3] = at(g + 8, t + 4);
}

/// acc[n] += A (16 x 8, \p a) times rows k0 .. k0 + 7 of \p rowsB (row stride
/// kRow) at the warp's columns col0 + 8 n ...
__device__ __forceinline__ void mmaRow(float (&acc)[kTiles][4], const uint32_t (&a)[4], const float *rowsB, int k0,
                                       int col0, int g, int t) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    const int col = col0 + 8 * n + g;
    mma1688Tf32(acc[n], a, toTf32(rowsB[(k0 + t) * kRow + col]), toTf32(rowsB[(k0 + t + 4) * kRow + col]));
  }
}

/// One depth step of 8 of both cotangents' products at a warp's rows m0..
/// and columns col0..: accA += gA's 16 x 8 tile at (m0, k0) (its transpose's
/// with \p Transposed) times rows k0.. of \p rowsA, accB alike with gB and
/// \p rowsB. dx passes two accumulators and one B (the scaled keys), dy one
/// accumulator (both references to it) and two (the scaled queries).
template <bool Transposed>
__device__ __forceinline__ void mmaPairStep(float (&accA)[kTiles][4], float (&accB)[kTiles][4], const float *pa,
                                            const float *pb, const float *rowsA, const float *rowsB, int m0, int k0,
                                            int col0, int g, int t) {
  uint32_t fa[4], fb[4];
  loadTf32A<Transposed>(fa, pa, kGradRow, m0, k0, g, t);
  loadTf32A<Transposed>(fb, pb, kGradRow, m0, k0, g, t);
  mmaRow(accA, fa, rowsA, k0, col0, g, t);
  mmaRow(accB, fb, rowsB, k0, col0, g, t);
}

/// Calls \p f(n, e, row, column) for element e of tile n of a warp's
/// accumulators (rows m0.., columns col0..): the m16n8 C layout.
template <typename F> __device__ __forceinline__ void forEachElement(int m0, int col0, int g, int t, F f) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      f(n, e, m0 + g + (e >= 2 ? 8 : 0), col0 + 8 * n + 2 * t + (e & 1));
}

/// A block per chunk: dxA, dxB and dy [64][128] as the scalar paired
/// kernel computes them, the blocks below the diagonal on tensor cores.
/// Steps, a barrier between each: load; scale the keys to each block row's
/// start (yhat); dx's lower blocks by MMA into registers, then into yhat's
/// place; the diagonal blocks per thread, adding dx's lower part (dxA, dxB
/// final; dy's diagonal part stored); scale the queries to their block's
/// start; dy's lower blocks by MMA, added to dy (a reduction: one adder per
/// element after the stores above).
__global__ void __launch_bounds__(kThreads, 1)
    pairedScoresMmaKernel(const float *gradA, const float *gradB, Bf16Keys keys, const float *cum, float *gradXA,
                          float *gradXB, float *gradY) {
  extern __shared__ __align__(16) float smem[];
  float *xas = smem, *xbs = xas + kChunk * kRow, *ys = xbs + kChunk * kRow, *gs = ys + kChunk * kRow;
  float *yhat = gs + kChunk * kRow, *pa = yhat + kScaledRows * kRow, *pb = pa + kChunk * kGradRow;
  const int64_t item = blockIdx.x, base = item * kChunk * kChannels;
  widenPadded(xas, keys.query + base, keys.queryScale, nullptr);
  widenPadded(ys, keys.key + base, 1.0f, nullptr);
  widenPadded(xbs, keys.key + base, 1.0f, keys.beta + item * kChunk);
  copyPadded(gs, cum + base, kChunk, kChannels, kRow);
  copyPadded(pa, gradA + item * kChunk * kChunk, kChunk, kChunk, kGradRow);
  copyPadded(pb, gradB + item * kChunk * kChunk, kChunk, kChunk, kGradRow);
  __syncthreads();
  scaleKeysToBlockRows(ys, gs, kRow, kChunk, kChannels, yhat);
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int blockRow = warp / 4, col0 = (warp % 4) * kQuarter, m0 = blockRow * kSub;
  // dx below the diagonal: rows of block a = blockRow against keys < a0.
  float lowA[kTiles][4] = {}, lowB[kTiles][4] = {};
  if (blockRow > 0) {
    const float *scaled = yhat + scaledKeysRow(blockRow) * kRow;
    for (int k0 = 0; k0 < m0; k0 += 8)
      mmaPairStep<false>(lowA, lowB, pa, pb, scaled, scaled, m0, k0, col0, g, t);
    forEachElement(m0, col0, g, t, [&](int n, int e, int r, int d) {
      const float back = __expf(gs[r * kRow + d] - gs[m0 * kRow + d]);
      lowA[n][e] *= back, lowB[n][e] *= back;
    });
  }
  __syncthreads(); // every warp has read yhat: dx's lower part takes its place
  float *stagedA = yhat - kSub * kRow, *stagedB = stagedA + (kChunk - kSub) * kRow; // rows 16 .. 63 each
  if (blockRow > 0)
    forEachElement(m0, col0, g, t, [&](int n, int e, int r, int d) {
      stagedA[r * kRow + d] = lowA[n][e];
      stagedB[r * kRow + d] = lowB[n][e];
    });
  __syncthreads();

  // The diagonal blocks: a thread per channel and four consecutive rows, as
  // the scalar kernel (each thread one group in every block row).
  {
    constexpr int R = kRowsPerThread;
    const int d = threadIdx.x % kChannels;
    for (int group = threadIdx.x / kChannels; group < kChunk / R; group += kThreads / kChannels) {
      const int r0 = group * R, a0 = r0 / kSub * kSub, end = a0 + kSub;
      float gr[R], dxa[R] = {}, dxb[R] = {}, dy[R] = {};
#pragma unroll
      for (int j = 0; j < R; ++j)
        gr[j] = gs[(r0 + j) * kRow + d];
      for (int i = a0; i < r0 + R; ++i) { // dx: keys a0 <= i <= r
        const float yi = ys[i * kRow + d], gi = gs[i * kRow + d];
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (i <= r0 + j) {
            const float ye = yi * __expf(gr[j] - gi);
            dxa[j] += pa[(r0 + j) * kGradRow + i] * ye;
            dxb[j] += pb[(r0 + j) * kGradRow + i] * ye;
          }
      }
      for (int q = r0; q < end; ++q) { // dy: queries r <= q < end
        const float xa = xas[q * kRow + d], xb = xbs[q * kRow + d], gq = gs[q * kRow + d];
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (q >= r0 + j)
            dy[j] += (pa[q * kGradRow + r0 + j] * xa + pb[q * kGradRow + r0 + j] * xb) * __expf(gq - gr[j]);
      }
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int r = r0 + j;
        const int64_t at = base + r * kChannels + d;
        gradXA[at] = dxa[j] + (a0 > 0 ? stagedA[r * kRow + d] : 0.0f);
        gradXB[at] = dxb[j] + (a0 > 0 ? stagedB[r * kRow + d] : 0.0f);
        gradY[at] = dy[j];
      }
    }
  }
  __syncthreads(); // the diagonal pass read the unscaled queries
  scaleRowsToBlockStart(xas, gs, kRow, kChunk, kChannels);
  scaleRowsToBlockStart(xbs, gs, kRow, kChunk, kChannels);
  __syncthreads();

  // dy below the diagonal: keys of block b = blockRow against each later
  // block a's queries, each pair's product scaled by e^{G_a0 - G_r}.
  if (blockRow + 1 < kBlocks) {
    float dy[kTiles][4] = {};
    for (int a = blockRow + 1; a < kBlocks; ++a) {
      const int a0 = a * kSub;
      float pair[kTiles][4] = {};
      for (int k0 = a0; k0 < a0 + kSub; k0 += 8)
        mmaPairStep<true>(pair, pair, pa, pb, xas, xbs, m0, k0, col0, g, t);
      forEachElement(m0, col0, g, t, [&](int n, int e, int r, int d) {
        dy[n][e] += __expf(gs[a0 * kRow + d] - gs[r * kRow + d]) * pair[n][e];
      });
    }
    forEachElement(m0, col0, g, t, [&](int n, int e, int r, int d) {
      atomicAdd(gradY + base + r * kChannels + d, dy[n][e]); // a reduction without a return
    });
  }
}

} // namespace

bool pairedScoresMmaEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_SCORES_MMA");
  return on;
}

bool pairedScoresMmaTakes(int chunk, int channels, const Bf16Keys &keys, const float *gradA, const float *gradB,
                          const float *cum) {
  const auto aligned = [](const void *p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return chunk == kChunk && channels == kChannels && keys.key != nullptr && keys.query != nullptr &&
         keys.beta != nullptr && aligned(keys.key, 8) && aligned(keys.query, 8) && aligned(gradA, 16) &&
         aligned(gradB, 16) && aligned(cum, 16);
}

void pairedScoresMmaBackward(const float *gradA, const float *gradB, const Bf16Keys &keys, const float *cum,
                             int64_t items, float *dxA, float *dxB, float *dy, cudaStream_t stream) {
  constexpr size_t bytes = kSharedFloats * sizeof(float);
  static_assert(bytes <= 227 * 1024, "the paired MMA kernel's tiles exceed an SM's shared memory");
  const auto kernel = pairedScoresMmaKernel;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<static_cast<unsigned>(items), kThreads, bytes, stream>>>(gradA, gradB, keys, cum, dxA, dxB, dy);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace adapt::rt::cuda::scores
