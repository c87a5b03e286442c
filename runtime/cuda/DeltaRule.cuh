//===- DeltaRule.cuh - tiles shared by the delta rule's kernels -----------===//
//
// The chunk's widths and the tile helpers of the forward
// (DeltaRuleKernel.cu) and backward (DeltaRuleBackwardKernel.cu) kernels:
// bf16 tiles in shared memory with rows padded by 8 elements (16 bytes), so
// fragment loads of consecutive rows fall in different banks, and mma.sync
// m16n8k16 fragments (Mma.cuh) loaded from them.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_DELTARULE_CUH
#define ADAPT_RUNTIME_CUDA_DELTARULE_CUH

#include "runtime/cuda/Mma.cuh"
#include "runtime/cuda/Switches.h"

#include <ATen/core/Tensor.h>

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace adapt::rt::cuda::delta {

using bf16 = __nv_bfloat16;

constexpr int kChunk = 64;         ///< Tokens per chunk.
constexpr int kDim = 128;          ///< dk = dv.
constexpr int kRow = kDim + 8;     ///< Shared row of a [64, 128] tile, in bf16.
constexpr int kSquareRow = kChunk + 8; ///< Shared row of a [64, 64] tile, in bf16.
constexpr int kStateColumns = 32;  ///< Value columns per recurrence block (the forward's may take 16).
/// Shared row of a [.., Columns] state tile, in bf16 (16 bytes of padding).
constexpr int stateRowOf(int columns) { return columns + 8; }
constexpr int kStateRow = stateRowOf(kStateColumns);

/// Two floats as a bf16 pair (lower index in the low half).
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&p);
}

/// B fragments of n-tiles n0 and n0 + 8 for k rows [k0, k0 + 16) of a
/// row-major [k][n] bf16 tile: b[0], b[1] for n0; b[2], b[3] for n0 + 8.
__device__ __forceinline__ void loadFragmentsB(uint32_t (&b)[4], const bf16 *tile, int stride, int k0, int n0,
                                               int lane) {
  const int matrix = lane / 8;
  ldmatrixX4Trans(b, tile + (k0 + (matrix % 2) * 8 + lane % 8) * stride + n0 + (matrix / 2) * 8);
}

/// The A fragment of M = rows [m0, m0 + 16), K = [k0, k0 + 16) of the
/// transpose of a row-major [k][m] bf16 tile.
__device__ __forceinline__ void loadFragmentATransposed(uint32_t (&a)[4], const bf16 *tile, int stride, int k0,
                                                        int m0, int lane) {
  const int matrix = lane / 8;
  ldmatrixX4Trans(a, tile + (k0 + (matrix / 2) * 8 + lane % 8) * stride + m0 + (matrix % 2) * 8);
}

/// The [128, Columns] slice of a state (or its gradient) that a recurrence
/// block keeps in mma accumulators: with four warps, warp w holds rows
/// [32 w, 32 w + 32) as two m-tiles (MT) of Columns / 8 n-tiles; with eight,
/// rows [16 w, 16 w + 16) as one.
template <int Columns = kStateColumns, int MT = 2> using StateSliceOf = float[MT][Columns / 8][4];
using StateSlice = StateSliceOf<>;

/// Calls f(mt, nt, i, row, column) for each of the warp's
/// StateSliceOf<Columns, MT> elements (row in [0, 128), column in [0, Columns)).
template <int Columns = kStateColumns, int MT = 2, typename F>
__device__ __forceinline__ void forStateSlice(int warp, int g, int t, F f) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < Columns / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        f(mt, nt, i, 16 * MT * warp + 16 * mt + g + (i / 2) * 8, 8 * nt + 2 * t + i % 2);
}

/// acc = the 16 rows at \p rows of a [..][kRow] tile times columns [col0,
/// col0 + 8 NT) of the [128][stride] tile \p state, K = 128.
template <int NT>
__device__ __forceinline__ void rowsTimesStateColumns(float (&acc)[NT][4], const bf16 *rows, const bf16 *state,
                                                      int stride, int col0, int g, int t, int lane) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[nt][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    uint32_t fa[4];
    loadFragmentA(fa, rows, kRow, kk, g, t);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t fb[4];
      loadFragmentsB(fb, state, stride, 16 * kk, col0 + 16 * np, lane);
      mma16816(acc[2 * np], fa, fb[0], fb[1]);
      mma16816(acc[2 * np + 1], fa, fb[2], fb[3]);
    }
  }
}

/// acc = rows [16 warp, 16 warp + 16) of the [64][kRow] tile \p rows times
/// the [128][stateRowOf(Columns)] tile \p state: a warp's share of a
/// chunk's [64, Columns] product with the state slice.
template <int Columns = kStateColumns>
__device__ __forceinline__ void chunkRowsTimesState(float (&acc)[Columns / 8][4], const bf16 *rows, const bf16 *state,
                                                    int warp, int g, int t, int lane) {
  rowsTimesStateColumns<Columns / 8>(acc, rows + 16 * warp * kRow, state, stateRowOf(Columns), 0, g, t, lane);
}

/// acc[nt] += rows [m0, m0 + 16) of the row-major tile \p a times columns
/// [n0 + 8 nt, +8) of b^T, with \p b row-major [n][k]: C = A B^T over K =
/// 16 \p Steps (the chunk's pair products, and products with a state's
/// transpose).
template <int NT, int Steps>
__device__ __forceinline__ void productABt(float (&acc)[NT][4], const bf16 *a, int aStride, const bf16 *b, int bStride,
                                           int m0, int n0, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < Steps; ++kk) {
    uint32_t fa[4];
    loadFragmentA(fa, a + m0 * aStride, aStride, kk, g, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const bf16 *col = b + (n0 + 8 * nt + g) * bStride + kk * 16 + 2 * t;
      mma16816(acc[nt], fa, bf16Pair(col), bf16Pair(col + 8));
    }
  }
}

/// acc[nt] += rows [m0, m0 + 16) of A times columns [n0 + 8 nt, +8) of the
/// row-major [k][n] tile \p b, K = 16 \p Steps. A is the row-major tile
/// \p a, or with \p TransposedA the transpose of the row-major [k][m] \p a.
template <int NT, int Steps, bool TransposedA = false>
__device__ __forceinline__ void productAB(float (&acc)[NT][4], const bf16 *a, int aStride, const bf16 *b, int bStride,
                                          int m0, int n0, int g, int t, int lane) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
#pragma unroll
  for (int kk = 0; kk < Steps; ++kk) {
    uint32_t fa[4];
    if constexpr (TransposedA)
      loadFragmentATransposed(fa, a, aStride, 16 * kk, m0, lane);
    else
      loadFragmentA(fa, a + m0 * aStride, aStride, kk, g, t);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t fb[4];
      loadFragmentsB(fb, b, bStride, 16 * kk, n0 + 16 * np, lane);
      mma16816(acc[2 * np], fa, fb[0], fb[1]);
      mma16816(acc[2 * np + 1], fa, fb[2], fb[3]);
    }
  }
}

/// acc[nt] += rows [m0, m0 + 16) of a^T times columns [n0 + 8 nt, +8) of
/// the row-major [k][n] tile \p b, with \p a row-major [k][m]: C = A^T B.
template <int NT, int Steps>
__device__ __forceinline__ void productAtB(float (&acc)[NT][4], const bf16 *a, int aStride, const bf16 *b, int bStride,
                                           int m0, int n0, int lane) {
  productAB<NT, Steps, true>(acc, a, aStride, b, bStride, m0, n0, lane / 4, lane % 4, lane);
}

/// Zeros a warp's accumulators.
template <int NT> __device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[nt][i] = 0.0f;
}

/// Calls f(nt, i, row, column) for each accumulator element of a warp's
/// [16, 8 NT] tile at (m0, n0).
template <int NT, typename F> __device__ __forceinline__ void forTile(int m0, int n0, int g, int t, F f) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      f(nt, i, m0 + g + (i / 2) * 8, n0 + 8 * nt + 2 * t + i % 2);
}

/// Calls f(nt, h, row, column) for each pair of accumulators (acc[nt][2 h],
/// acc[nt][2 h + 1]) of a warp's [16, 8 NT] tile at (m0, n0): columns
/// column and column + 1 of the row, for paired stores.
template <int NT, typename F> __device__ __forceinline__ void forPairs(int m0, int n0, int g, int t, F f) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      f(nt, h, m0 + g + 8 * h, n0 + 8 * nt + 2 * t);
}

/// The sum of \p x over the four lanes that share a tile row (same g).
__device__ __forceinline__ float rowLanesSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// The sum of \p x over the eight lanes that share a tile column (same t).
__device__ __forceinline__ float columnLanesSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

/// Copies 16 bytes from global to shared memory, zeros where \p valid is
/// false: with cp.async (Async, completing at asyncWait) or a plain load
/// and store. Both addresses 16-byte aligned.
template <bool Async>
__device__ __forceinline__ void copy16(void *dst, const void *src, bool valid = true) {
  if constexpr (Async) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(valid ? 16 : 0));
  } else {
    *reinterpret_cast<uint4 *>(dst) = valid ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0);
  }
}

/// copy16 with the choice made at run time (uniform across the block).
__device__ __forceinline__ void copy16(void *dst, const void *src, bool valid, bool async) {
  if (async)
    copy16<true>(dst, src, valid);
  else
    copy16<false>(dst, src, valid);
}

/// Rounds a contiguous fp32 [Rows][Width] array into the bf16 \p tile
/// (\p stride elements per row) by a block of 256 threads: every load is
/// issued before the first store, so they are in flight together.
template <int Rows, int Width>
__device__ __forceinline__ void loadFloatBatched(__nv_bfloat16 *tile, int stride, const float *x) {
  constexpr int kPerThread = Rows * Width / 4 / 256;
  static_assert(kPerThread * 4 * 256 == Rows * Width, "whole float4 per thread");
  float4 v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j)
    v[j] = *reinterpret_cast<const float4 *>(x + 4 * (threadIdx.x + 256 * j));
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = 4 * (threadIdx.x + 256 * j), r = i / Width, c = i % Width;
    *reinterpret_cast<uint2 *>(tile + r * stride + c) = make_uint2(packBf16(v[j].x, v[j].y), packBf16(v[j].z, v[j].w));
  }
}

/// Closes this thread's group of cp.async copies.
__device__ __forceinline__ void asyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most \p Pending of this thread's cp.async groups are in
/// flight (a barrier must follow before other threads read the data).
template <int Pending> __device__ __forceinline__ void asyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

/// Copies \p rows rows of a contiguous [.., \p Width] bf16 array into \p tile.
template <int Width = kDim>
__device__ __forceinline__ void loadBf16(bf16 *tile, int stride, const bf16 *x, int rows, bool async) {
  for (int i = threadIdx.x; i < rows * Width / 8; i += blockDim.x) {
    const int r = i / (Width / 8), c = (i % (Width / 8)) * 8;
    copy16(tile + r * stride + c, x + r * Width + c, true, async);
  }
}

/// Waits for this thread's cp.async copies when \p async (a barrier follows).
__device__ __forceinline__ void awaitCopies(bool async) {
  if (async) {
    asyncCommit();
    asyncWait<0>();
  }
}

/// Rounds \p rows rows of a contiguous fp32 array \p width wide into the bf16 \p tile.
__device__ __forceinline__ void loadFloat(bf16 *tile, int stride, const float *x, int rows, int width) {
  for (int i = threadIdx.x; i < rows * width / 4; i += blockDim.x) {
    const int r = i / (width / 4), c = (i % (width / 4)) * 4;
    const float4 v = *reinterpret_cast<const float4 *>(x + r * width + c);
    *reinterpret_cast<uint2 *>(tile + r * stride + c) = make_uint2(packBf16(v.x, v.y), packBf16(v.z, v.w));
  }
}

/// Rounds \p Rows rows of a gradient kept in fp32 [.., 128] into the bf16 \p tile.
template <int Rows> __device__ __forceinline__ void loadGrad(bf16 *tile, int stride, const float *x, bool async) {
  if (async)
    loadFloatBatched<Rows, kDim>(tile, stride, x);
  else
    loadFloat(tile, stride, x, Rows, kDim);
}

/// Copies \p Rows rows of a gradient kept in bf16 [.., 128] into \p tile.
template <int Rows> __device__ __forceinline__ void loadGrad(bf16 *tile, int stride, const bf16 *x, bool async) {
  loadBf16(tile, stride, x, Rows, async);
}

/// Whether the delta rule's kernels load their tiles without waiting on each
/// load: the recurrence kernels prefetch each next chunk's tiles with
/// cp.async into double buffers while the current one computes; the
/// per-chunk kernels issue all their bf16 tiles as cp.async and their fp32
/// tiles as batched loads, then wait once. On (checked on an H100, 1.7-1.9x
/// faster); ADAPT_DELTA_RULE_PREFETCH=0 waits on each load instead.
bool asyncLoads();

/// On by default (ADAPT_DELTA_RULE_LEAN_BACKWARD=0: off): the GPU backward keeps each chunk's dS'
/// and dV_new in bf16 (kernels 3 and 4 read them as bf16 tiles either way;
/// only the chunk's last-decay sum reads dS' rounded) and reads dO in place
/// when it is contiguous and fills whole chunks: 1 GiB less at 1 x 32 heads
/// x 32K tokens (measured on an H200, session 43: 6.54 -> 5.54 GiB peak, and
/// 12.4 -> 11.9 ms forward + backward). Its op checks passed there.
bool leanBackward();

/// Whether GDN's forward folds the rows' scalar factors into the smaller
/// operand: beta exp(G) and beta into T's columns in the transform, scale
/// exp(G) into q S_n's rows in fp32 in the output (session 47; 64 x 64 passes
/// instead of 64 x 128 ones). On since its op checks passed on an H100
/// (session 47; GDN's forward 3-5 % faster); ADAPT_DELTA_RULE_FOLD_FACTORS=0
/// scales k, v and q in place instead.
bool foldFactors();

/// The value columns a block of the forward's state kernel takes for \p heads
/// sequences (B·H) with four warps (stateWarps(); eight take 32): 32, or 16
/// where a block per 32 columns would leave SMs idle or one block on each
/// (heads x 4 <= the SM count; 1 x 32 heads on 132 SMs), so that two blocks
/// share each SM and hide each other's latency. ADAPT_DELTA_RULE_STATE_COLUMNS
/// =16 or 32 sets it; unset (the default since session 45's checks on an
/// H100), this rule chooses. GDN forward at 1 x 32 heads x 32K: 3.60 -> 3.46
/// ms; at 4 x 16 x 4K 16 columns are slower (0.83 -> 0.94 ms), so the rule
/// keeps 32 there.
int stateColumns(int64_t heads);

/// Warps a block of the state kernels (forward and backward) runs for
/// \p heads sequences (B·H): 8 (32 columns a block) where a block per 32
/// columns leaves each SM one block or none (B·H x 4 <= the SM count), else
/// 4 (columns by stateColumns()); ADAPT_DELTA_RULE_STATE_WARPS=4|8 forces
/// one. Checked on an H100 in session 46: GDN forward + backward at 1 x 32 x
/// 8K 2.74 -> 2.59 ms, at 32K 10.16 -> 9.87 ms with eight; at 4 x 16 x 4K
/// (256 blocks) the forward is slower with eight in two calls (0.83 -> 0.85
/// ms) and the whole ambiguous (2.65 / 2.63, 2.54 / 2.66), so four stay
/// there. The kernel is latency-bound
/// with one warp per SM sub-partition: each chunk's ~600 dependent
/// instructions (the mma chains, the tiles' cp.async issue, the state's
/// stores) wait out their latency with nothing to switch to. Eight warps
/// split the same work in halves (V_new by column halves, the state by
/// 16-row slices, the loads by thread) with two warps on each
/// sub-partition, without the 16-column form's second copy of W and k.
int stateWarps(int64_t heads);

/// A [B, H, T, D] tensor's data and its strides over b, h and t.
struct Strided {
  const bf16 *data;
  int64_t b, h, t;
  int64_t heads;
  __device__ __forceinline__ const bf16 *row(int64_t bh, int64_t token) const {
    return data + (bh / heads) * b + (bh % heads) * h + token * t;
  }
};

/// Copies rows [row0, row0 + 64) of \p x (128 wide) into \p tile, zeros
/// past \p valid; with \p async as cp.async copies (asyncWait before use).
__device__ __forceinline__ void loadRows(bf16 *tile, const Strided &x, int64_t bh, int64_t row0, int valid,
                                         bool async = false) {
  for (int i = threadIdx.x; i < kChunk * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    copy16(tile + r * kRow + c, x.row(bh, r < valid ? row0 + r : row0) + c, r < valid, async);
  }
}

/// T = (I + A)^-1 for a chunk's unit lower-triangular system, in place:
/// \p a [64][65] fp32 holds A's strictly lower part and receives T's (T's
/// unit diagonal is not stored). Row r of T is -sum_{m<r} A[r][m] T[m]
/// (+ e_r), computed once the rows above are T's; four threads per column j
/// share the sum over m. Every thread of a 256-thread block calls it.
__device__ __forceinline__ void invertUnitLower(float *a, int tid) {
  const int j = tid / 4, part = tid % 4;
  for (int r = 1; r < kChunk; ++r) {
    float sum = 0.0f;
    if (j < r) // T[j][j] = 1 is not stored: that term is A[r][j] itself
      for (int m = j + part; m < r; m += 4)
        sum += m == j ? a[r * (kChunk + 1) + j] : a[r * (kChunk + 1) + m] * a[m * (kChunk + 1) + j];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    __syncthreads(); // every thread has read row r before it is overwritten
    if (j < r && part == 0)
      a[r * (kChunk + 1) + j] = -sum;
    __syncthreads();
  }
}

/// Whether the transform kernels invert by 16-row blocks
/// (invertUnitLowerBlocked): the default since its op checks passed on an
/// H100 (session 44); ADAPT_DELTA_RULE_BLOCK_INVERSE=0 substitutes row by row.
bool blockInverse();

/// The transform kernels' inverse: 0 row by row, 1 by blocks (blockInverse),
/// 2 by blocks with split sums (ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1 as well).
int inverseForm();

/// \p init + sum of term(m) for m in [begin, end): in order in one chain, or
/// with \p split as two interleaved chains (even and odd m) added at the end,
/// so that each step waits on the term two back rather than the last.
template <typename Term>
__device__ __forceinline__ float chainSum(float init, int begin, int end, bool split, Term term) {
  float sum = init;
  if (!split) {
    for (int m = begin; m < end; ++m)
      sum += term(m);
    return sum;
  }
  float odd = 0.0f;
  int m = begin;
  for (; m + 1 < end; m += 2) {
    sum += term(m);
    odd += term(m + 1);
  }
  if (m < end)
    sum += term(m);
  return sum + odd;
}

/// invertUnitLower by 16-row blocks, with the same layout and result (up to
/// fp32 summation order): each diagonal block by one warp (15 dependent
/// steps under __syncwarp), then block rows 1 to 3 in turn,
/// T_IJ = -T_II sum_{K=J}^{I-1} A_IK T_KJ, the sums through \p scratch
/// (3 x 16 x 16 fp32, free memory of the caller's). Seven block barriers
/// where the row-by-row form takes 126: that serial chain is most of the
/// transform kernel's 2.1 ms at 1 x 32 heads x 32K on the H200.
/// With \p split, every dot product runs as interleaved partial sums (four
/// in the block rows' X_J, two in the diagonal blocks and in T_II X_J), so
/// that a thread waits one shared load and FMA latency per four (or two)
/// terms rather than per term (X_J's sums are up to 48 terms long, ~30
/// cycles a term in one chain); the same terms, summed in another order (ADAPT_DELTA_RULE_INVERSE_SPLIT_SUMS=1, opt-in
/// until checked on a GPU).
__device__ __forceinline__ void invertUnitLowerBlocked(float *a, float *scratch, int tid, bool split = false) {
  constexpr int S = kChunk + 1, B = 16, Blocks = kChunk / B;
  const int warp = tid / 32, lane = tid % 32;
  if (warp < Blocks) { // diagonal block `warp`, lane j < 16 its column j
    const int o = B * warp, j = lane;
    for (int r = 1; r < B; ++r) {
      float sum = 0.0f;
      if (j < r) // T[j][j] = 1 is not stored: that term is A[r][j] itself
        sum = chainSum(a[(o + r) * S + o + j], j + 1, r, split,
                       [&](int m) { return a[(o + r) * S + o + m] * a[(o + m) * S + o + j]; });
      __syncwarp(); // the warp has read row r before it is overwritten
      if (j < r)
        a[(o + r) * S + o + j] = -sum;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int I = 1; I < Blocks; ++I) {
    // X_J = sum_{K=J}^{I-1} A_IK T_KJ for every J < I (row block I still A).
    for (int e = tid; e < I * B * B; e += blockDim.x) {
      const int J = e / (B * B), r = (e / B) % B, c = e % B;
      const float *arow = a + (B * I + r) * S;
      float sum = 0.0f;
      if (split) { // 16 (I - J) terms, a multiple of 4
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int m = B * J; m < B * I; m += 4)
#pragma unroll
          for (int p = 0; p < 4; ++p)
            part[p] += arow[m + p] * (m + p == B * J + c ? 1.0f : a[(m + p) * S + B * J + c]);
        sum = (part[0] + part[1]) + (part[2] + part[3]);
      } else {
        for (int m = B * J; m < B * I; ++m) // T[m][J*16 + c]: the unit diagonal where m is that column
          sum += arow[m] * (m == B * J + c ? 1.0f : a[m * S + B * J + c]);
      }
      scratch[e] = sum;
    }
    __syncthreads();
    // T_IJ = -T_II X_J, T_II unit lower (its strict part stored).
    for (int e = tid; e < I * B * B; e += blockDim.x) {
      const int J = e / (B * B), r = (e / B) % B, c = e % B;
      const float *trow = a + (B * I + r) * S + B * I;
      const float *x = scratch + J * B * B;
      a[(B * I + r) * S + B * J + c] =
          -chainSum(x[r * B + c], 0, r, split, [&](int m) { return trow[m] * x[m * B + c]; });
    }
    __syncthreads();
  }
}

/// Writes rows [0, 64) of T \p ts [64][kSquareRow] times \p rhs [64][kRow]
/// (bf16) to the contiguous [64, 128] rows at \p dst: W = T Xk or U = T Xv
/// of a chunk, a warp per 16 rows (mt) and 64 columns (half).
__device__ __forceinline__ void storeTransformed(bf16 *dst, const bf16 *ts, const bf16 *rhs, int mt, int half, int g,
                                                 int t, int lane) {
  float acc[8][4];
  zero(acc);
  productAB<8, kChunk / 16>(acc, ts, kSquareRow, rhs, kRow, 16 * mt, 64 * half, g, t, lane);
  forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
    *reinterpret_cast<uint32_t *>(dst + r * kDim + c) = packBf16(acc[nt][2 * h], acc[nt][2 * h + 1]);
  });
}

/// Writes the chunk's output rows below \p valid to \p out (contiguous, 128
/// wide): the decayed queries \p qs [64][kRow] times the entering state \p ss
/// [128][kRow], plus the causal scores \p ps [64][kSquareRow] times V_new \p vs.
/// With \p queryRowScale (64 floats) \p qs holds the queries as loaded and
/// each row of their product is scaled by it in fp32 (a decay per row, as
/// GDN's scalar gate), which saves the pass that would decay qs in place.
__device__ __forceinline__ void storeChunkOutput(bf16 *out, const bf16 *qs, const bf16 *ss, const bf16 *ps,
                                                 const bf16 *vs, int valid, int mt, int half, int g, int t,
                                                 int lane, const float *queryRowScale = nullptr) {
  float acc[8][4];
  zero(acc);
  productAB<8, kDim / 16>(acc, qs, kRow, ss, kRow, 16 * mt, 64 * half, g, t, lane);
  if (queryRowScale) {
    const float top = queryRowScale[16 * mt + g], bottom = queryRowScale[16 * mt + g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[nt][0] *= top;
      acc[nt][1] *= top;
      acc[nt][2] *= bottom;
      acc[nt][3] *= bottom;
    }
  }
  productAB<8, kChunk / 16>(acc, ps, kSquareRow, vs, kRow, 16 * mt, 64 * half, g, t, lane);
  forPairs<8>(16 * mt, 64 * half, g, t, [&](int nt, int h, int r, int c) {
    if (r < valid)
      *reinterpret_cast<uint32_t *>(out + r * kDim + c) = packBf16(acc[nt][2 * h], acc[nt][2 * h + 1]);
  });
}

/// A [B, H, T, 128] bf16 tensor's rows for the kernels.
inline Strided stridedRows(const at::Tensor &x) {
  return {reinterpret_cast<const bf16 *>(x.data_ptr<at::BFloat16>()), x.stride(0), x.stride(1), x.stride(2),
          x.size(1)};
}

/// A bf16 tensor's data as the kernels' element type.
inline const bf16 *bf16Data(const at::Tensor &x) { return reinterpret_cast<const bf16 *>(x.data_ptr<at::BFloat16>()); }
inline bf16 *bf16Data(at::Tensor &x) { return reinterpret_cast<bf16 *>(x.data_ptr<at::BFloat16>()); }

/// Allows \p kernel \p bytes of dynamic shared memory (above 48 KiB).
template <typename Kernel> void allowSharedMemory(Kernel kernel, size_t bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

/// Asks for \p kernel's largest shared-memory carveout: a kernel whose two
/// blocks need nearly all of an SM's 228 KiB fits two only there, and the
/// driver need not choose it unasked.
template <typename Kernel> void preferLargestCarveout(Kernel kernel) {
  C10_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

} // namespace adapt::rt::cuda::delta

#endif // ADAPT_RUNTIME_CUDA_DELTARULE_CUH
