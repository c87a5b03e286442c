//===- DeltaRuleKernel.cu - the chunked delta rule's serial part ----------===//
//
// One block per (batch x head, tile of kTile value columns), 256 threads,
// walking the chunks in order (forward) or in reverse (backward). Shared
// memory holds the state slice [dk, kTile] and the chunk's [c, kTile]
// intermediates, rows padded to kTile + 1 floats so that a warp reading one
// column of 32 rows hits 32 banks. Every loop maps a warp to one output row
// and its lanes to consecutive columns: the row operand (a row of R, Q, W or
// A in global memory) is one broadcast load, the column operand a
// conflict-free shared load. Columns past dv are zero in shared memory, so
// they add nothing to the sums.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/DeltaRuleKernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;           ///< value columns per block
constexpr int kStride = kTile + 1;  ///< shared row stride (bank-conflict padding)
constexpr int64_t kMaxChunk = 64, kMaxKey = 256;

/// The sizes every kernel reads.
struct Dims {
  int chunks, c, dk, dv, groups; ///< groups: 1 (a decay per head) or dk
};

/// Copies the [rows, kTile] tile at column j0 of a row-major [rows, dv]
/// matrix into shared memory (zeros past dv).
__device__ __forceinline__ void loadTile(float *tile, const float *src, int rows, int dv, int j0) {
  for (int o = threadIdx.x; o < rows * kTile; o += blockDim.x) {
    const int r = o / kTile, j = o % kTile;
    tile[r * kStride + j] = j0 + j < dv ? src[int64_t(r) * dv + j0 + j] : 0.0f;
  }
}

/// The reverse of loadTile (columns past dv are not written).
__device__ __forceinline__ void storeTile(float *dst, const float *tile, int rows, int dv, int j0) {
  for (int o = threadIdx.x; o < rows * kTile; o += blockDim.x) {
    const int r = o / kTile, j = o % kTile;
    if (j0 + j < dv)
      dst[int64_t(r) * dv + j0 + j] = tile[r * kStride + j];
  }
}

/// U = V - R S over the chunk's c rows (the corrected values).
__device__ __forceinline__ void correctedValues(float *U, const float *S, const float *V, const float *R,
                                                const Dims &d, int j0) {
  for (int o = threadIdx.x; o < d.c * kTile; o += blockDim.x) {
    const int i = o / kTile, j = o % kTile;
    const float *r = R + int64_t(i) * d.dk;
    float acc = 0.0f;
    for (int k = 0; k < d.dk; ++k)
      acc = fmaf(r[k], S[k * kStride + j], acc);
    U[i * kStride + j] = (j0 + j < d.dv ? V[int64_t(i) * d.dv + j0 + j] : 0.0f) - acc;
  }
}

__global__ void __launch_bounds__(kThreads)
    recurrenceForwardKernel(const float *__restrict__ V, const float *__restrict__ R, const float *__restrict__ Q,
                            const float *__restrict__ A, const float *__restrict__ D, const float *__restrict__ W,
                            const float *__restrict__ S0, float *__restrict__ O, float *__restrict__ states,
                            float *__restrict__ finalState, Dims d) {
  extern __shared__ float shared[];
  float *S = shared, *U = S + d.dk * kStride;
  const int64_t bh = blockIdx.x;
  const int j0 = blockIdx.y * kTile;
  loadTile(S, S0 + bh * d.dk * d.dv, d.dk, d.dv, j0);
  __syncthreads();
  for (int n = 0; n < d.chunks; ++n) {
    const int64_t chunk = bh * d.chunks + n;
    const float *Rn = R + chunk * d.c * d.dk, *Qn = Q + chunk * d.c * d.dk, *Wn = W + chunk * d.c * d.dk;
    const float *An = A + chunk * d.c * d.c, *Dn = D + chunk * d.groups;
    storeTile(states + chunk * d.dk * d.dv, S, d.dk, d.dv, j0);
    correctedValues(U, S, V + chunk * d.c * d.dv, Rn, d, j0);
    __syncthreads();
    // O = Q S + A U.
    for (int o = threadIdx.x; o < d.c * kTile; o += blockDim.x) {
      const int i = o / kTile, j = o % kTile;
      const float *q = Qn + int64_t(i) * d.dk, *a = An + int64_t(i) * d.c;
      float acc = 0.0f;
      for (int k = 0; k < d.dk; ++k)
        acc = fmaf(q[k], S[k * kStride + j], acc);
      for (int m = 0; m < d.c; ++m)
        acc = fmaf(a[m], U[m * kStride + j], acc);
      if (j0 + j < d.dv)
        O[(chunk * d.c + i) * d.dv + j0 + j] = acc;
    }
    __syncthreads();
    // S = diag(d) S + W^T U: each thread updates the entries it alone reads.
    for (int o = threadIdx.x; o < d.dk * kTile; o += blockDim.x) {
      const int k = o / kTile, j = o % kTile;
      float acc = S[k * kStride + j] * Dn[d.groups == 1 ? 0 : k];
      for (int i = 0; i < d.c; ++i)
        acc = fmaf(Wn[int64_t(i) * d.dk + k], U[i * kStride + j], acc);
      S[k * kStride + j] = acc;
    }
    __syncthreads();
  }
  storeTile(finalState + bh * d.dk * d.dv, S, d.dk, d.dv, j0);
}

/// The column-tile partial sums of one chunk's gradients that sum over
/// value columns: dA = dO U^T, dQ = dO S^T, dW = U G^T, dR = -dU S^T and
/// dd_k = sum_j S_kj G_kj, each over this tile's columns only.
__device__ __forceinline__ void tilePartials(const float *S, const float *G, const float *U, const float *gO,
                                             const float *gU, float *pA, float *pQ, float *pW, float *pR,
                                             float *pD, const Dims &d) {
  for (int o = threadIdx.x; o < d.c * d.c; o += blockDim.x) {
    const int i = o / d.c, m = o % d.c;
    float acc = 0.0f;
#pragma unroll 8
    for (int j = 0; j < kTile; ++j)
      acc = fmaf(gO[i * kStride + j], U[m * kStride + j], acc);
    pA[o] = acc;
  }
  for (int o = threadIdx.x; o < d.c * d.dk; o += blockDim.x) {
    const int i = o / d.dk, k = o % d.dk;
    float q = 0.0f, w = 0.0f, r = 0.0f;
#pragma unroll 8
    for (int j = 0; j < kTile; ++j) {
      const float s = S[k * kStride + j];
      q = fmaf(gO[i * kStride + j], s, q);
      w = fmaf(U[i * kStride + j], G[k * kStride + j], w);
      r = fmaf(gU[i * kStride + j], s, r);
    }
    pQ[o] = q;
    pW[o] = w;
    pR[o] = -r;
  }
  for (int k = threadIdx.x; k < d.dk; k += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < kTile; ++j)
      acc = fmaf(S[k * kStride + j], G[k * kStride + j], acc);
    pD[k] = acc;
  }
}

__global__ void __launch_bounds__(kThreads)
    recurrenceBackwardKernel(const float *__restrict__ V, const float *__restrict__ R, const float *__restrict__ Q,
                             const float *__restrict__ A, const float *__restrict__ D, const float *__restrict__ W,
                             const float *__restrict__ states, const float *__restrict__ gradOut,
                             const float *__restrict__ gradFinal, float *__restrict__ dV, float *__restrict__ pA,
                             float *__restrict__ pQ, float *__restrict__ pW, float *__restrict__ pR,
                             float *__restrict__ pD, float *__restrict__ dS0, Dims d, int64_t bhCount) {
  extern __shared__ float shared[];
  float *S = shared, *G = S + d.dk * kStride, *U = G + d.dk * kStride, *gO = U + d.c * kStride,
        *gU = gO + d.c * kStride;
  const int64_t bh = blockIdx.x;
  const int j0 = blockIdx.y * kTile;
  // This tile's slice of the partial buffers: [tiles, b*h, n, ...].
  const int64_t tileChunks = (int64_t(blockIdx.y) * bhCount + bh) * d.chunks;
  loadTile(G, gradFinal + bh * d.dk * d.dv, d.dk, d.dv, j0);
  for (int n = d.chunks - 1; n >= 0; --n) {
    const int64_t chunk = bh * d.chunks + n, part = tileChunks + n;
    const float *Rn = R + chunk * d.c * d.dk, *Qn = Q + chunk * d.c * d.dk, *Wn = W + chunk * d.c * d.dk;
    const float *An = A + chunk * d.c * d.c, *Dn = D + chunk * d.groups;
    loadTile(S, states + chunk * d.dk * d.dv, d.dk, d.dv, j0);
    loadTile(gO, gradOut + chunk * d.c * d.dv, d.c, d.dv, j0);
    __syncthreads();
    correctedValues(U, S, V + chunk * d.c * d.dv, Rn, d, j0);
    // dU = A^T dO + W G (the gradient of V too).
    for (int o = threadIdx.x; o < d.c * kTile; o += blockDim.x) {
      const int i = o / kTile, j = o % kTile;
      const float *w = Wn + int64_t(i) * d.dk;
      float acc = 0.0f;
      for (int m = 0; m < d.c; ++m)
        acc = fmaf(An[int64_t(m) * d.c + i], gO[m * kStride + j], acc);
      for (int k = 0; k < d.dk; ++k)
        acc = fmaf(w[k], G[k * kStride + j], acc);
      gU[i * kStride + j] = acc;
      if (j0 + j < d.dv)
        dV[(chunk * d.c + i) * d.dv + j0 + j] = acc;
    }
    __syncthreads();
    tilePartials(S, G, U, gO, gU, pA + part * d.c * d.c, pQ + part * d.c * d.dk, pW + part * d.c * d.dk,
                 pR + part * d.c * d.dk, pD + part * d.dk, d);
    __syncthreads();
    // G = Q^T dO + diag(d) G - R^T dU: the gradient of the entering state.
    for (int o = threadIdx.x; o < d.dk * kTile; o += blockDim.x) {
      const int k = o / kTile, j = o % kTile;
      float acc = G[k * kStride + j] * Dn[d.groups == 1 ? 0 : k];
      for (int i = 0; i < d.c; ++i) {
        acc = fmaf(Qn[int64_t(i) * d.dk + k], gO[i * kStride + j], acc);
        acc = fmaf(-Rn[int64_t(i) * d.dk + k], gU[i * kStride + j], acc);
      }
      G[k * kStride + j] = acc;
    }
    __syncthreads();
  }
  storeTile(dS0 + bh * d.dk * d.dv, G, d.dk, d.dv, j0);
}

Dims dimsOf(const at::Tensor &values, const at::Tensor &reads, const at::Tensor &decays) {
  return Dims{int(values.size(2)), int(values.size(3)), int(reads.size(4)), int(values.size(4)),
              int(decays.size(3))};
}

/// Shared memory for \p rows rows of kStride floats, opted in above 48 KiB.
size_t sharedBytes(const void *kernel, int rows) {
  const size_t bytes = size_t(rows) * kStride * sizeof(float);
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return bytes;
}

} // namespace

bool deltaRecurrenceFits(const at::Tensor &values, const at::Tensor &reads) {
  return values.is_cuda() && values.scalar_type() == at::kFloat && reads.scalar_type() == at::kFloat &&
         values.dim() == 5 && reads.dim() == 5 && values.size(3) <= kMaxChunk && reads.size(4) <= kMaxKey &&
         values.size(2) > 0 && values.size(0) * values.size(1) > 0;
}

std::vector<at::Tensor> deltaRecurrenceForward(const at::Tensor &values, const at::Tensor &reads,
                                               const at::Tensor &queries, const at::Tensor &scores,
                                               const at::Tensor &decays, const at::Tensor &writes,
                                               const at::Tensor &state0) {
  const c10::cuda::CUDAGuard guard(values.device());
  const Dims d = dimsOf(values, reads, decays);
  const int64_t bh = values.size(0) * values.size(1);
  at::Tensor out = at::empty_like(values);
  at::Tensor states = at::empty({values.size(0), values.size(1), d.chunks, d.dk, d.dv}, values.options());
  at::Tensor finalState = at::empty_like(state0);
  const dim3 grid{unsigned(bh), unsigned((d.dv + kTile - 1) / kTile)};
  const size_t smem = sharedBytes(reinterpret_cast<const void *>(recurrenceForwardKernel), d.dk + d.c);
  recurrenceForwardKernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
      values.data_ptr<float>(), reads.data_ptr<float>(), queries.data_ptr<float>(), scores.data_ptr<float>(),
      decays.data_ptr<float>(), writes.data_ptr<float>(), state0.data_ptr<float>(), out.data_ptr<float>(),
      states.data_ptr<float>(), finalState.data_ptr<float>(), d);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, states, finalState};
}

std::vector<at::Tensor> deltaRecurrenceBackward(const at::Tensor &values, const at::Tensor &reads,
                                                const at::Tensor &queries, const at::Tensor &scores,
                                                const at::Tensor &decays, const at::Tensor &writes,
                                                const at::Tensor &states, const at::Tensor &gradOut,
                                                const at::Tensor &gradFinal) {
  const c10::cuda::CUDAGuard guard(values.device());
  const Dims d = dimsOf(values, reads, decays);
  const int64_t b = values.size(0), h = values.size(1), bh = b * h, tiles = (d.dv + kTile - 1) / kTile;
  const auto f = values.options();
  at::Tensor dV = at::empty_like(values), dS0 = at::empty({b, h, d.dk, d.dv}, f);
  at::Tensor pA = at::empty({tiles, b, h, d.chunks, d.c, d.c}, f);
  at::Tensor pQ = at::empty({tiles, b, h, d.chunks, d.c, d.dk}, f);
  at::Tensor pW = at::empty_like(pQ), pR = at::empty_like(pQ);
  at::Tensor pD = at::empty({tiles, b, h, d.chunks, d.dk}, f);
  const dim3 grid{unsigned(bh), unsigned(tiles)};
  const size_t smem = sharedBytes(reinterpret_cast<const void *>(recurrenceBackwardKernel), 2 * d.dk + 3 * d.c);
  recurrenceBackwardKernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
      values.data_ptr<float>(), reads.data_ptr<float>(), queries.data_ptr<float>(), scores.data_ptr<float>(),
      decays.data_ptr<float>(), writes.data_ptr<float>(), states.data_ptr<float>(), gradOut.data_ptr<float>(),
      gradFinal.data_ptr<float>(), dV.data_ptr<float>(), pA.data_ptr<float>(), pQ.data_ptr<float>(),
      pW.data_ptr<float>(), pR.data_ptr<float>(), pD.data_ptr<float>(), dS0.data_ptr<float>(), d, bh);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor dd = pD.sum(0);
  if (d.groups == 1)
    dd = dd.sum(-1, /*keepdim=*/true);
  return {dV, pR.sum(0), pQ.sum(0), pA.sum(0), dd, pW.sum(0), dS0};
}

} // namespace adapt::rt::cuda
