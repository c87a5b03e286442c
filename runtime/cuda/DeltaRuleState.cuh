//===- DeltaRuleState.cuh - the delta rule's state recurrence kernel ------===//
//
// The serial kernel of the chunked delta rule's forward, shared by Gated
// DeltaNet's scalar decay (DeltaRuleKernel.cu) and Kimi's per-channel decay
// (KimiDeltaKernel.cu): a block per (32 or 16 value columns, b·h) walks
// the chunks in order with the state [128, columns] in mma accumulators
// (fp32), writing each chunk's entering state and V_new = U - W S in bf16.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_DELTARULESTATE_CUH
#define ADAPT_RUNTIME_CUDA_DELTARULESTATE_CUH

#include "runtime/cuda/DeltaRule.cuh"

#include <utility>

namespace adapt::rt::cuda::delta {

/// One chunk's operands of the state recurrence in shared memory, for a
/// block of \p Columns value columns.
template <int Columns> struct StateTiles {
  static constexpr int kStateRow = stateRowOf(Columns);
  bf16 *ws;   ///< W [64][kRow]
  bf16 *ks;   ///< k [64][kRow]
  bf16 *us;   ///< U's Columns columns [64][kStateRow] (prefetching only)
  float *cum; ///< G of the chunk's tokens [64], or of its last token per key channel [128]
  /// The bytes of one set (a multiple of 16).
  static constexpr size_t kBytes = (2 * kChunk * kRow + kChunk * kStateRow) * sizeof(bf16) + kDim * sizeof(float);
  __device__ static StateTiles at(unsigned char *p) {
    StateTiles s;
    s.ws = reinterpret_cast<bf16 *>(p);
    s.ks = s.ws + kChunk * kRow;
    s.us = s.ks + kChunk * kRow;
    s.cum = reinterpret_cast<float *>(s.us + kChunk * kStateRow);
    return s;
  }
};

/// Loads chunk \p n's W (unless Delta is off: W = 0), k (zeros past the
/// \p tokens) and G into \p s, and with Async (cp.async) U's Columns columns
/// too. PerChannel (Kimi): \p key holds the keys already decayed to the
/// chunk's end, and \p cum the last token's G per key channel [B·H, n, 128].
template <bool Async, bool PerChannel, int Columns, bool Delta = true>
__device__ __forceinline__ void loadStateTiles(const StateTiles<Columns> &s, const Strided &key, const bf16 *w, const bf16 *u,
                                               const float *cum, int64_t bh, int64_t padded, int64_t tokens, int n,
                                               int col0) {
  const int64_t row0 = int64_t(n) * kChunk, rows0 = bh * padded + row0;
  for (int i = threadIdx.x; i < kChunk * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    if constexpr (Delta)
      copy16<Async>(s.ws + r * kRow + c, w + (rows0 + r) * kDim + c);
    const bool valid = row0 + r < tokens;
    copy16<Async>(s.ks + r * kRow + c, key.row(bh, valid ? row0 + r : 0) + c, valid);
  }
  if constexpr (Async)
    for (int i = threadIdx.x; i < kChunk * Columns / 8; i += blockDim.x) {
      const int r = i / (Columns / 8), c = (i % (Columns / 8)) * 8;
      copy16<true>(s.us + r * StateTiles<Columns>::kStateRow + c, u + (rows0 + r) * kDim + col0 + c);
    }
  if constexpr (PerChannel) {
    if (threadIdx.x < kDim / 4)
      copy16<Async>(s.cum + 4 * threadIdx.x, cum + (bh * (padded / kChunk) + n) * kDim + 4 * threadIdx.x);
  } else if (threadIdx.x < kChunk / 4) {
    copy16<Async>(s.cum + 4 * threadIdx.x, cum + rows0 + 4 * threadIdx.x);
  }
}

/// Kernel 2, a block (32 \p Warps threads) per (\p Columns value columns,
/// b·h), over the chunks in order: writes each chunk's entering state (bf16)
/// and V_new. With four warps, warp w holds the state's rows [32 w, 32 w +
/// 32) as mma accumulators and computes V_new's rows [16 w, 16 w + 16); with
/// eight (stateWarps()), rows [16 w, 16 w + 16) of the state, and V_new's
/// rows [16 (w % 4), +16) in column half w / 4.
/// With \p Prefetch, two sets of tiles: chunk n + 1's load in flight while
/// chunk n computes. With \p PerChannel (Kimi's decay per key channel),
/// \p key holds k e^{G_last - G} and \p cum each chunk's last G per channel:
/// the state's row r decays by e^{G_last, r} and V_new enters undecayed.
/// Without \p Delta (linear attention with decay: W = 0, \p w unread),
/// V_new = U: its product with the state is skipped, and it is not written
/// out (\p newValues unused; the output kernel reads U).
template <bool Prefetch, bool PerChannel = false, int Columns = kStateColumns, int Warps = 4, bool Delta = true>
__global__ void __launch_bounds__(32 * Warps)
    deltaRuleStateKernel(Strided key, const bf16 *w, const bf16 *u, const float *cum, int64_t tokens, int chunks,
                         const float *initialState, bf16 *states, bf16 *newValues, float *finalState) {
  using Tiles = StateTiles<Columns>;
  static_assert(Warps == 4 || (Warps == 8 && Columns == 32), "8 warps take 32 columns");
  constexpr int kStateRow = Tiles::kStateRow, NT = Columns / 8, NP = Columns / 16;
  constexpr int MT = 8 / Warps;              // the state's m-tiles per warp
  constexpr int Halves = Warps / 4;          // V_new's column groups
  constexpr int NTV = NT / Halves;           // V_new's n-tiles per warp
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *ss = reinterpret_cast<bf16 *>(shared); // the entering state [128][kStateRow]
  bf16 *vn = ss + kDim * kStateRow;             // decayed V_new [64][kStateRow]
  unsigned char *sets = reinterpret_cast<unsigned char *>(vn + kChunk * kStateRow);
  const int64_t bh = blockIdx.y;
  const int col0 = blockIdx.x * Columns;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t padded = int64_t(chunks) * kChunk;
  // This warp's V_new tile (with four warps the forms of the kernel before
  // eight existed: rows 16 w, all columns).
  const int vRow = Warps == 4 ? 16 * warp : 16 * (warp % 4), vCol = Warps == 4 ? 0 : (warp / 4) * (Columns / Halves);
  StateSliceOf<Columns, MT> s;
  forStateSlice<Columns, MT>(warp, g, t, [&](int mt, int nt, int i, int r, int c) {
    s[mt][nt][i] = initialState ? initialState[(bh * kDim + r) * kDim + col0 + c] : 0.0f;
  });
  if constexpr (Prefetch) {
    loadStateTiles<true, PerChannel, Columns, Delta>(Tiles::at(sets), key, w, u, cum, bh, padded, tokens, 0, col0);
    asyncCommit();
  }
  for (int n = 0; n < chunks; ++n) {
    const int64_t row0 = int64_t(n) * kChunk;
    const Tiles tiles = Tiles::at(sets + (Prefetch ? (n & 1) : 0) * Tiles::kBytes);
    // The entering state: to shared memory (bf16, an mma operand) and out.
    bf16 *stateOut = states + ((bh * chunks + n) * kDim) * kDim;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = 16 * MT * warp + 16 * mt + g, c = 8 * nt + 2 * t;
        const uint32_t lo = packBf16(s[mt][nt][0], s[mt][nt][1]), hi = packBf16(s[mt][nt][2], s[mt][nt][3]);
        *reinterpret_cast<uint32_t *>(ss + r * kStateRow + c) = lo;
        *reinterpret_cast<uint32_t *>(ss + (r + 8) * kStateRow + c) = hi;
        *reinterpret_cast<uint32_t *>(stateOut + r * kDim + col0 + c) = lo;
        *reinterpret_cast<uint32_t *>(stateOut + (r + 8) * kDim + col0 + c) = hi;
      }
    if constexpr (Prefetch) {
      if (n + 1 < chunks)
        loadStateTiles<true, PerChannel, Columns, Delta>(Tiles::at(sets + ((n + 1) & 1) * Tiles::kBytes), key, w, u,
                                                         cum, bh, padded, tokens, n + 1, col0);
      asyncCommit();
      asyncWait<1>(); // this chunk's copies have landed
    } else {
      loadStateTiles<false, PerChannel, Columns, Delta>(tiles, key, w, u, cum, bh, padded, tokens, n, col0);
    }
    __syncthreads();
    const float *cs = tiles.cum;
    const float last = PerChannel ? 0.0f : cs[kChunk - 1];
    // V_new = U - W S: this warp's 16 rows and Columns / Halves columns.
    {
      float acc[NTV][4];
      if constexpr (Delta)
        rowsTimesStateColumns<NTV>(acc, tiles.ws + vRow * kRow, ss, kStateRow, vCol, g, t, lane);
      else
        zero(acc);
#pragma unroll
      for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = vRow + g + 8 * h, c = vCol + 8 * nt + 2 * t;
          const int64_t at = (bh * padded + row0 + r) * kDim + col0 + c;
          const __nv_bfloat162 uu = Prefetch ? *reinterpret_cast<const __nv_bfloat162 *>(tiles.us + r * kStateRow + c)
                                             : *reinterpret_cast<const __nv_bfloat162 *>(u + at);
          const float v0 = __low2float(uu) - acc[nt][2 * h], v1 = __high2float(uu) - acc[nt][2 * h + 1];
          if constexpr (Delta) // without, V_new = U: the caller keeps U
            *reinterpret_cast<uint32_t *>(newValues + at) = packBf16(v0, v1);
          const float d = PerChannel ? 1.0f : __expf(last - cs[r]);
          *reinterpret_cast<uint32_t *>(vn + r * kStateRow + c) = packBf16(v0 * d, v1 * d);
        }
    }
    __syncthreads();
    // S <- exp(G_last) S + k^T (exp(G_last - G) V_new).
    if constexpr (PerChannel) {
      forStateSlice<Columns, MT>(warp, g, t, [&](int mt, int nt, int i, int r, int) { s[mt][nt][i] *= __expf(cs[r]); });
    } else {
      const float chunkDecay = __expf(last);
      forStateSlice<Columns, MT>(warp, g, t, [&](int mt, int nt, int i, int, int) { s[mt][nt][i] *= chunkDecay; });
    }
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      uint32_t fb[NP][4];
#pragma unroll
      for (int np = 0; np < NP; ++np)
        loadFragmentsB(fb[np], vn, kStateRow, 16 * kk, 16 * np, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t fa[4];
        loadFragmentATransposed(fa, tiles.ks, kRow, 16 * kk, 16 * MT * warp + 16 * mt, lane);
#pragma unroll
        for (int np = 0; np < NP; ++np) {
          mma16816(s[mt][2 * np], fa, fb[np][0], fb[np][1]);
          mma16816(s[mt][2 * np + 1], fa, fb[np][2], fb[np][3]);
        }
      }
    }
    __syncthreads(); // before the next chunk's tiles overwrite these
  }
  if (finalState)
    forStateSlice<Columns, MT>(warp, g, t, [&](int mt, int nt, int i, int r, int c) {
      finalState[(bh * kDim + r) * kDim + col0 + c] = s[mt][nt][i];
    });
}

/// Dynamic shared memory of deltaRuleStateKernel over \p columns (32 or
/// 16): the state, V_new and one set of tiles, or two when prefetching. A
/// set is laid out by StateTiles::at whether or not U's columns are loaded.
inline size_t stateKernelBytes(bool prefetch, int columns) {
  const size_t set = columns == 16 ? StateTiles<16>::kBytes : StateTiles<32>::kBytes;
  return (kDim + kChunk) * stateRowOf(columns) * sizeof(bf16) + (prefetch ? 2 : 1) * set;
}

/// The forward's state kernel for \p columns (32 or 16; stateColumns()),
/// \p warps (4, or 8 with 32 columns; stateWarps()) and \p prefetch, with
/// the shared memory it needs allowed; Delta off: W = 0 (see the kernel).
template <bool PerChannel, bool Delta = true> auto stateKernelFor(bool prefetch, int columns, int warps) {
  auto kernel = warps == 8     ? (prefetch ? deltaRuleStateKernel<true, PerChannel, 32, 8, Delta>
                                           : deltaRuleStateKernel<false, PerChannel, 32, 8, Delta>)
                : columns == 16 ? (prefetch ? deltaRuleStateKernel<true, PerChannel, 16, 4, Delta>
                                            : deltaRuleStateKernel<false, PerChannel, 16, 4, Delta>)
                                : (prefetch ? deltaRuleStateKernel<true, PerChannel, 32, 4, Delta>
                                            : deltaRuleStateKernel<false, PerChannel, 32, 4, Delta>);
  allowSharedMemory(kernel, stateKernelBytes(prefetch, columns));
  return kernel;
}

/// The launch shape of the forward's state kernel for \p heads sequences
/// (B·H): {columns, warps}.
inline std::pair<int, int> stateLaunch(int64_t heads) {
  const int warps = stateWarps(heads);
  return {warps == 8 ? 32 : stateColumns(heads), warps};
}

} // namespace adapt::rt::cuda::delta

#endif // ADAPT_RUNTIME_CUDA_DELTARULESTATE_CUH
