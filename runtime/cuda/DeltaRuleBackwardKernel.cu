//===- DeltaRuleBackwardKernel.cu - the delta rule's state gradient -------===//
//
// The serial part of the chunked delta rule's backward (runtime/
// DeltaRuleFunction.cpp) as one kernel, the forward's recurrence kernel run
// backwards: a block per (32 value columns, b·h) walks the chunks from the
// last to the first with dS [128, 32] in the mma accumulators (fp32).
// Per chunk: dS' is written out (fp32), dV_new = localNew + Kd dS' (written,
// fp32), then dS = e^{G_last} dS' + Qd^T dO - W^T dV_new, where dV_new
// enters the last product negated and rounded to bf16, as the forward's
// operands are. With Kimi's decay per key channel, row d of dS' decays by
// e^{G_last, d} instead (Kd and Qd carry their per-channel factors already).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/DeltaRule.cuh"
#include "runtime/cuda/DeltaRuleKernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

namespace adapt::rt::cuda {

namespace {

using namespace delta;

/// One chunk's operands of the backward recurrence in shared memory.
struct BackwardTiles {
  bf16 *kd;        ///< Kd [64][kRow]
  bf16 *qd;        ///< Qd [64][kRow]
  bf16 *ws;        ///< W [64][kRow]
  bf16 *dos;       ///< dO's 32 columns [64][kStateRow]
  float *localNew; ///< P^T dO's 32 columns [64][kStateColumns] (prefetching only)
  float *cum;      ///< G of the chunk [64] (prefetching only)
  /// The bytes of one set (a multiple of 16).
  static constexpr size_t kBytes = (3 * kChunk * kRow + kChunk * kStateRow) * sizeof(bf16) +
                                   (kChunk * kStateColumns + kChunk) * sizeof(float);
  __device__ static BackwardTiles at(unsigned char *p) {
    BackwardTiles s;
    s.kd = reinterpret_cast<bf16 *>(p);
    s.qd = s.kd + kChunk * kRow;
    s.ws = s.qd + kChunk * kRow;
    s.dos = s.ws + kChunk * kRow;
    s.localNew = reinterpret_cast<float *>(s.dos + kChunk * kStateRow);
    s.cum = s.localNew + kChunk * kStateColumns;
    return s;
  }
};

/// Loads the chunk at rows [rows0, rows0 + 64) of the [B·H·n·64, 128]
/// operands into \p s (Async: cp.async; localNew and G only then, G only
/// for a scalar decay; W only with Delta).
template <bool Async, bool PerChannel = false, bool Delta = true>
__device__ __forceinline__ void loadBackwardTiles(const BackwardTiles &s, const bf16 *keysToEnd,
                                                  const bf16 *queryDecayed, const bf16 *w, const bf16 *gradOut,
                                                  const float *localNew, const float *cum, int64_t rows0, int col0) {
  for (int i = threadIdx.x; i < kChunk * kDim / 8; i += blockDim.x) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    const int64_t at = (rows0 + r) * kDim + c;
    copy16<Async>(s.kd + r * kRow + c, keysToEnd + at);
    copy16<Async>(s.qd + r * kRow + c, queryDecayed + at);
    if constexpr (Delta)
      copy16<Async>(s.ws + r * kRow + c, w + at);
  }
  for (int i = threadIdx.x; i < kChunk * kStateColumns / 8; i += blockDim.x) {
    const int r = i / (kStateColumns / 8), c = (i % (kStateColumns / 8)) * 8;
    copy16<Async>(s.dos + r * kStateRow + c, gradOut + (rows0 + r) * kDim + col0 + c);
  }
  if constexpr (Async) {
    for (int i = threadIdx.x; i < kChunk * kStateColumns / 4; i += blockDim.x) {
      const int r = i / (kStateColumns / 4), c = (i % (kStateColumns / 4)) * 4;
      copy16<true>(s.localNew + r * kStateColumns + c, localNew + (rows0 + r) * kDim + col0 + c);
    }
    if (!PerChannel && threadIdx.x < kChunk / 4)
      copy16<true>(s.cum + 4 * threadIdx.x, cum + rows0 + 4 * threadIdx.x);
  }
}

/// Stores two values of a gradient kept in fp32.
__device__ __forceinline__ void storePair(float *p, float a, float b) {
  *reinterpret_cast<float2 *>(p) = make_float2(a, b);
}

/// Stores two values of a gradient kept in bf16.
__device__ __forceinline__ void storePair(bf16 *p, float a, float b) {
  *reinterpret_cast<uint32_t *>(p) = packBf16(a, b);
}

/// With \p Prefetch, two sets of tiles: chunk n - 1's load in flight while
/// chunk n computes. dS' and dV_new go out as \p Grad (fp32 or bf16). With
/// \p PerChannel, \p cum is each chunk's last G per key channel [B·H, n,
/// 128] rather than G per token [B·H, n·64]. \p Warps as the forward's
/// state kernel (DeltaRuleState.cuh): four, or eight with dS by 16-row
/// slices and dV_new by column halves (delta::stateWarps()). Without
/// \p Delta (W = 0, \p w unread) the W^T dV_new term is skipped.
template <bool Prefetch, typename Grad, bool PerChannel = false, int Warps = 4, bool Delta = true>
__global__ void __launch_bounds__(32 * Warps)
    deltaRuleStateBackwardKernel(const bf16 *keysToEnd, const bf16 *queryDecayed, const bf16 *w, const bf16 *gradOut,
                                 const float *localNew, const float *cum, int chunks, const float *gradFinal,
                                 Grad *leaving, Grad *gradNew, float *gradInitial) {
  static_assert(Warps == 4 || Warps == 8, "four or eight warps");
  constexpr int MT = 8 / Warps, Halves = Warps / 4, NTV = (kStateColumns / 8) / Halves;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16 *dss = reinterpret_cast<bf16 *>(shared); // dS' [128][kStateRow]
  bf16 *dvn = dss + kDim * kStateRow;           // -dV_new [64][kStateRow]
  unsigned char *sets = reinterpret_cast<unsigned char *>(dvn + kChunk * kStateRow);
  const int64_t bh = blockIdx.y, padded = int64_t(chunks) * kChunk;
  const int col0 = blockIdx.x * kStateColumns;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t base = bh * padded;
  // This warp's dV_new tile (with four warps: rows 16 w, all columns).
  const int vRow = Warps == 4 ? 16 * warp : 16 * (warp % 4),
            vCol = Warps == 4 ? 0 : (warp / 4) * (kStateColumns / Halves);
  StateSliceOf<kStateColumns, MT> ds;
  forStateSlice<kStateColumns, MT>(warp, g, t, [&](int mt, int nt, int i, int r, int c) {
    ds[mt][nt][i] = gradFinal[(bh * kDim + r) * kDim + col0 + c];
  });
  if constexpr (Prefetch) {
    loadBackwardTiles<true, PerChannel, Delta>(BackwardTiles::at(sets + ((chunks - 1) & 1) * BackwardTiles::kBytes), keysToEnd,
                            queryDecayed, w, gradOut, localNew, cum, base + padded - kChunk, col0);
    asyncCommit();
  }
  for (int n = chunks - 1; n >= 0; --n) {
    const int64_t row0 = int64_t(n) * kChunk;
    const BackwardTiles s = BackwardTiles::at(sets + (Prefetch ? (n & 1) : 0) * BackwardTiles::kBytes);
    // dS' (leaving the chunk): out, and to shared memory in bf16.
    Grad *leavingOut = leaving + ((bh * chunks + n) * kDim) * kDim;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int r = 16 * MT * warp + 16 * mt + g, c = 8 * nt + 2 * t;
        const uint32_t lo = packBf16(ds[mt][nt][0], ds[mt][nt][1]), hi = packBf16(ds[mt][nt][2], ds[mt][nt][3]);
        *reinterpret_cast<uint32_t *>(dss + r * kStateRow + c) = lo;
        *reinterpret_cast<uint32_t *>(dss + (r + 8) * kStateRow + c) = hi;
        storePair(leavingOut + r * kDim + col0 + c, ds[mt][nt][0], ds[mt][nt][1]);
        storePair(leavingOut + (r + 8) * kDim + col0 + c, ds[mt][nt][2], ds[mt][nt][3]);
      }
    if constexpr (Prefetch) {
      if (n > 0)
        loadBackwardTiles<true, PerChannel, Delta>(BackwardTiles::at(sets + ((n - 1) & 1) * BackwardTiles::kBytes), keysToEnd,
                                queryDecayed, w, gradOut, localNew, cum, base + row0 - kChunk, col0);
      asyncCommit();
      asyncWait<1>(); // this chunk's copies have landed
    } else {
      loadBackwardTiles<false, false, Delta>(s, keysToEnd, queryDecayed, w, gradOut, nullptr, nullptr, base + row0, col0);
    }
    __syncthreads();
    const float last = PerChannel ? 0.0f : Prefetch ? s.cum[kChunk - 1] : cum[base + row0 + kChunk - 1];
    // dV_new = localNew + Kd dS': this warp's 16 rows and 32 / Halves columns.
    {
      float acc[NTV][4];
      rowsTimesStateColumns<NTV>(acc, s.kd + vRow * kRow, dss, kStateRow, vCol, g, t, lane);
#pragma unroll
      for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = vRow + g + 8 * h, c = vCol + 8 * nt + 2 * t;
          const int64_t at = (base + row0 + r) * kDim + col0 + c;
          const float2 local = Prefetch ? *reinterpret_cast<const float2 *>(s.localNew + r * kStateColumns + c)
                                        : *reinterpret_cast<const float2 *>(localNew + at);
          const float v0 = local.x + acc[nt][2 * h], v1 = local.y + acc[nt][2 * h + 1];
          storePair(gradNew + at, v0, v1);
          *reinterpret_cast<uint32_t *>(dvn + r * kStateRow + c) = packBf16(-v0, -v1);
        }
    }
    __syncthreads();
    // dS = e^{G_last} dS' + Qd^T dO + W^T (-dV_new): warp w takes dS's rows
    // [32 w, 32 w + 32), K = the chunk's 64 tokens.
    if constexpr (PerChannel) {
      const float *rowLast = cum + (bh * chunks + n) * kDim;
      forStateSlice<kStateColumns, MT>(warp, g, t,
                                       [&](int mt, int nt, int i, int r, int) { ds[mt][nt][i] *= __expf(rowLast[r]); });
    } else {
      const float chunkDecay = __expf(last);
      forStateSlice<kStateColumns, MT>(warp, g, t, [&](int mt, int nt, int i, int, int) { ds[mt][nt][i] *= chunkDecay; });
    }
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      uint32_t fo[2][4], fv[2][4];
      loadFragmentsB(fo[0], s.dos, kStateRow, 16 * kk, 0, lane);
      loadFragmentsB(fo[1], s.dos, kStateRow, 16 * kk, 16, lane);
      loadFragmentsB(fv[0], dvn, kStateRow, 16 * kk, 0, lane);
      loadFragmentsB(fv[1], dvn, kStateRow, 16 * kk, 16, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t fq[4], fw[4];
        loadFragmentATransposed(fq, s.qd, kRow, 16 * kk, 16 * MT * warp + 16 * mt, lane);
        if constexpr (Delta)
          loadFragmentATransposed(fw, s.ws, kRow, 16 * kk, 16 * MT * warp + 16 * mt, lane);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          mma16816(ds[mt][2 * np], fq, fo[np][0], fo[np][1]);
          mma16816(ds[mt][2 * np + 1], fq, fo[np][2], fo[np][3]);
          if constexpr (Delta) {
            mma16816(ds[mt][2 * np], fw, fv[np][0], fv[np][1]);
            mma16816(ds[mt][2 * np + 1], fw, fv[np][2], fv[np][3]);
          }
        }
      }
    }
    __syncthreads(); // before the next chunk's tiles overwrite these
  }
  forStateSlice<kStateColumns, MT>(warp, g, t, [&](int mt, int nt, int i, int r, int c) {
    gradInitial[(bh * kDim + r) * kDim + col0 + c] = ds[mt][nt][i];
  });
}

bool bf16Rows(const at::Tensor &x, int64_t rows) {
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() == 3 &&
         x.size(1) == rows && x.size(2) == kDim;
}

} // namespace

bool deltaRuleStateBackwardTakes(int64_t keyDim, int64_t valueDim, int64_t chunkSize) {
  return keyDim == kDim && valueDim == kDim && chunkSize == kChunk;
}

DeltaRuleStateGrads deltaRuleStateBackward(const at::Tensor &keysToEnd, const at::Tensor &queryDecayed,
                                           const at::Tensor &w, const at::Tensor &gradOut,
                                           const at::Tensor &localNew, const at::Tensor &cum,
                                           const at::Tensor &gradFinal, bool perChannel) {
  const int64_t bh = keysToEnd.size(0), padded = keysToEnd.size(1), chunks = padded / kChunk;
  TORCH_CHECK(padded % kChunk == 0 && bf16Rows(keysToEnd, padded) && bf16Rows(queryDecayed, padded) &&
                  (!w.defined() || (bf16Rows(w, padded) && w.size(0) == bh)) && bf16Rows(gradOut, padded) &&
                  queryDecayed.size(0) == bh && gradOut.size(0) == bh && (w.defined() || !perChannel),
              "deltaRuleStateBackward: expected contiguous bf16 [B*H, n*64, 128] Kd, Qd, W (or none, W = 0, for a "
              "scalar decay) and dO");
  TORCH_CHECK(localNew.scalar_type() == at::kFloat && localNew.is_contiguous() && localNew.numel() == bh * padded * kDim &&
                  cum.scalar_type() == at::kFloat && cum.is_contiguous() &&
                  cum.numel() == (perChannel ? bh * chunks * kDim : bh * padded) &&
                  gradFinal.scalar_type() == at::kFloat && gradFinal.is_contiguous() &&
                  gradFinal.numel() == bh * kDim * kDim,
              "deltaRuleStateBackward: expected fp32 contiguous localNew [B*H, n*64, 128], cum [B*H, n*64] (or "
              "[B*H, n, 128] per channel) and gradFinal [B*H, 128, 128]");
  TORCH_CHECK(bh <= 65535 && chunks > 0, "deltaRuleStateBackward: expected 1 to 65,535 heads and a chunk");
  const c10::cuda::CUDAGuard guard(keysToEnd.device());
  const auto f32 = localNew.options();
  const bool lean = leanBackward() && !perChannel;
  const auto gradOptions = lean ? keysToEnd.options() : f32;
  DeltaRuleStateGrads r{at::empty({bh, chunks, kDim, kDim}, gradOptions), at::empty({bh, padded, kDim}, gradOptions),
                        at::empty({bh, kDim, kDim}, f32)};
  const bool prefetch = asyncLoads();
  const size_t bytes = (kDim + kChunk) * kStateRow * sizeof(bf16) +
                       (prefetch ? 2 * BackwardTiles::kBytes : (3 * kChunk * kRow + kChunk * kStateRow) * sizeof(bf16));
  auto bf = [](const at::Tensor &x) { return reinterpret_cast<const bf16 *>(x.data_ptr<at::BFloat16>()); };
  const int warps = stateWarps(bh);
  auto launch = [&](auto kernel, auto *leaving, auto *gradNew) {
    allowSharedMemory(kernel, bytes);
    kernel<<<dim3(kDim / kStateColumns, bh), 32 * warps, bytes, at::cuda::getCurrentCUDAStream()>>>(
        bf(keysToEnd), bf(queryDecayed), w.defined() ? bf(w) : nullptr, bf(gradOut), localNew.data_ptr<float>(), cum.data_ptr<float>(),
        static_cast<int>(chunks), gradFinal.data_ptr<float>(), leaving, gradNew, r.initial.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  // The kernel for a gradient type and decay kind, with the prefetch and
  // warps chosen.
  auto pick = [&](auto kernels) { return kernels[(prefetch ? 1 : 0) + (warps == 8 ? 2 : 0)]; };
  if (perChannel) {
    using K = decltype(&deltaRuleStateBackwardKernel<true, float, true>);
    const K kernels[] = {deltaRuleStateBackwardKernel<false, float, true>, deltaRuleStateBackwardKernel<true, float, true>,
                         deltaRuleStateBackwardKernel<false, float, true, 8>,
                         deltaRuleStateBackwardKernel<true, float, true, 8>};
    launch(pick(kernels), r.leaving.data_ptr<float>(), r.newValues.data_ptr<float>());
  } else if (lean) {
    auto *leaving = reinterpret_cast<bf16 *>(r.leaving.data_ptr<at::BFloat16>());
    auto *gradNew = reinterpret_cast<bf16 *>(r.newValues.data_ptr<at::BFloat16>());
    using K = decltype(&deltaRuleStateBackwardKernel<true, bf16>);
    const K kernels[] = {deltaRuleStateBackwardKernel<false, bf16>, deltaRuleStateBackwardKernel<true, bf16>,
                         deltaRuleStateBackwardKernel<false, bf16, false, 8>,
                         deltaRuleStateBackwardKernel<true, bf16, false, 8>};
    const K withoutW[] = {deltaRuleStateBackwardKernel<false, bf16, false, 4, false>,
                          deltaRuleStateBackwardKernel<true, bf16, false, 4, false>,
                          deltaRuleStateBackwardKernel<false, bf16, false, 8, false>,
                          deltaRuleStateBackwardKernel<true, bf16, false, 8, false>};
    launch(w.defined() ? pick(kernels) : pick(withoutW), leaving, gradNew);
  } else if (!w.defined()) {
    using K = decltype(&deltaRuleStateBackwardKernel<true, float>);
    const K kernels[] = {deltaRuleStateBackwardKernel<false, float, false, 4, false>,
                         deltaRuleStateBackwardKernel<true, float, false, 4, false>,
                         deltaRuleStateBackwardKernel<false, float, false, 8, false>,
                         deltaRuleStateBackwardKernel<true, float, false, 8, false>};
    launch(pick(kernels), r.leaving.data_ptr<float>(), r.newValues.data_ptr<float>());
  } else {
    using K = decltype(&deltaRuleStateBackwardKernel<true, float>);
    const K kernels[] = {deltaRuleStateBackwardKernel<false, float>, deltaRuleStateBackwardKernel<true, float>,
                         deltaRuleStateBackwardKernel<false, float, false, 8>,
                         deltaRuleStateBackwardKernel<true, float, false, 8>};
    launch(pick(kernels), r.leaving.data_ptr<float>(), r.newValues.data_ptr<float>());
  }
  return r;
}

} // namespace adapt::rt::cuda
