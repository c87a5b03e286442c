//===- SparseMlaKernel.cu - sparse MLA's forward in one kernel ------------===//
//
// A block of 4 warps per (query, 16 heads). Per tile of 64 selected slots:
//   1. the slots' latent rows are gathered into shared memory (16-byte loads);
//   2. warp w computes the 16 x 16 logits of slots [16w, 16w + 16) over the
//      576 columns (A = the query's heads, B = the rows: mma m16n8k16);
//   3. the tile's row maxima and sums go through shared memory, so every
//      warp keeps the same running max and sum per head (online softmax),
//      and P (bf16) is written to shared memory;
//   4. warp w adds P V for its 128 of the 512 value columns, V's fragments
//      read transposed from the gathered rows (ldmatrix .trans).
// The accumulator layout of m16n8k16: a thread holds rows g and g + 8 for
// columns 2t and 2t + 1 (g = lane / 4, t = lane % 4).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/SparseMlaKernel.h"
#include "runtime/cuda/Mma.cuh"
#include "runtime/cuda/SparseMla.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace adapt::rt::cuda {

namespace {

using namespace sparse_mla;

constexpr int kSlots = 64; ///< Selected rows per shared-memory tile.
constexpr int kProbRow = kSlots + 8;
constexpr int kColumnsPerWarp = kValueDim / kWarps; ///< 128 value columns per warp.
constexpr int kValueTiles = kColumnsPerWarp / 8;    ///< 16 n-tiles per warp.
constexpr size_t kSharedBytes =
    sizeof(__nv_bfloat16) * (kHeads * kRow + kSlots * kRow + kHeads * kProbRow) + sizeof(float) * 2 * kWarps * kHeads;

__global__ void __launch_bounds__(kWarps * 32)
    sparseLatentForwardKernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ keys,
                              const int64_t *__restrict__ indices, const bool *__restrict__ valid,
                              __nv_bfloat16 *__restrict__ out, float *__restrict__ lse, int64_t seqLen,
                              int64_t heads, int64_t keep, int64_t keyLen, float scale) {
  extern __shared__ __align__(16) unsigned char shared[];
  __nv_bfloat16 *queryTile = reinterpret_cast<__nv_bfloat16 *>(shared); // [16][kRow]
  __nv_bfloat16 *rowTile = queryTile + kHeads * kRow;                    // [kSlots][kRow]
  __nv_bfloat16 *probTile = rowTile + kSlots * kRow;                     // [16][kProbRow]
  float *maxPart = reinterpret_cast<float *>(probTile + kHeads * kProbRow); // [kWarps][16]
  float *sumPart = maxPart + kWarps * kHeads;                               // [kWarps][16]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t batch = blockIdx.y, token = batch * seqLen + blockIdx.x;
  const int64_t firstHead = int64_t(blockIdx.z) * kHeads;
  gatherRows(queryTile, q, kHeads, [&](int r) { return token * heads + firstHead + r; });
  const int64_t *slotRows = indices + token * keep;
  const bool *slotValid = valid + token * keep;

  const float negInf = negativeInfinity();
  float runningMax[2] = {negInf, negInf}, runningSum[2] = {0.0f, 0.0f}; // Rows g and g + 8.
  float acc[kValueTiles][4];
#pragma unroll
  for (int nt = 0; nt < kValueTiles; ++nt)
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  for (int64_t firstSlot = 0; firstSlot < keep; firstSlot += kSlots) {
    __syncthreads(); // The previous tile's readers are done (and the query tile is in).
    gatherRows(rowTile, keys, kSlots, [&](int r) {
      const int64_t slot = firstSlot + r;
      return slot < keep ? latentRow(batch, keyLen, slotRows[slot]) : int64_t(-1);
    });
    __syncthreads();

    // Logits of slots [16 warp, 16 warp + 16): two n-tiles.
    float logits[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll 4
    for (int ks = 0; ks < kKeyDim / 16; ++ks) {
      uint32_t a[4];
      loadFragmentA(a, queryTile, kRow, ks, g, t);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const __nv_bfloat16 *b = rowTile + (warp * 16 + j * 8 + g) * kRow + ks * 16 + 2 * t;
        mma16816(logits[j], a, bf16Pair(b), bf16Pair(b + 8));
      }
    }
    float tileMax[2] = {negInf, negInf};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t slot = firstSlot + warp * 16 + j * 8 + 2 * t + (e & 1);
        const bool use = slot < keep && slotValid[slot];
        logits[j][e] = use ? roundedLogit(logits[j][e], scale) : negInf;
        tileMax[e >> 1] = fmaxf(tileMax[e >> 1], logits[j][e]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tileMax[r] = fmaxf(tileMax[r], __shfl_xor_sync(0xffffffffu, tileMax[r], 1));
      tileMax[r] = fmaxf(tileMax[r], __shfl_xor_sync(0xffffffffu, tileMax[r], 2));
    }
    if (t == 0) {
      maxPart[warp * kHeads + g] = tileMax[0];
      maxPart[warp * kHeads + g + 8] = tileMax[1];
    }
    __syncthreads();
    float newMax[2], rescale[2], tileSum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      newMax[r] = runningMax[r];
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        newMax[r] = fmaxf(newMax[r], maxPart[w * kHeads + g + 8 * r]);
      // Nothing valid yet: keep everything at zero (exp(-inf - -inf) is NaN).
      rescale[r] = newMax[r] == negInf ? 1.0f : __expf(runningMax[r] - newMax[r]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float p0 = newMax[r] == negInf ? 0.0f : __expf(logits[j][2 * r] - newMax[r]);
        const float p1 = newMax[r] == negInf ? 0.0f : __expf(logits[j][2 * r + 1] - newMax[r]);
        tileSum[r] += p0 + p1;
        *reinterpret_cast<__nv_bfloat162 *>(probTile + (g + 8 * r) * kProbRow + warp * 16 + j * 8 + 2 * t) =
            __floats2bfloat162_rn(p0, p1);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tileSum[r] += __shfl_xor_sync(0xffffffffu, tileSum[r], 1);
      tileSum[r] += __shfl_xor_sync(0xffffffffu, tileSum[r], 2);
    }
    if (t == 0) {
      sumPart[warp * kHeads + g] = tileSum[0];
      sumPart[warp * kHeads + g + 8] = tileSum[1];
    }
    __syncthreads(); // P and the partial sums are in.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        sum += sumPart[w * kHeads + g + 8 * r];
      runningSum[r] = runningSum[r] * rescale[r] + sum;
      runningMax[r] = newMax[r];
    }
#pragma unroll
    for (int nt = 0; nt < kValueTiles; ++nt) {
      acc[nt][0] *= rescale[0];
      acc[nt][1] *= rescale[0];
      acc[nt][2] *= rescale[1];
      acc[nt][3] *= rescale[1];
    }
    // acc += P [16 x 64] . V [64 x this warp's 128 columns].
    addProductWithRows<kSlots>(acc, probTile, kProbRow, rowTile, warp * kColumnsPerWarp);
  }

  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    inverse[r] = runningSum[r] > 0.0f ? 1.0f / runningSum[r] : 0.0f;
  __nv_bfloat16 *outRows = out + (token * heads + firstHead) * kValueDim + warp * kColumnsPerWarp + 2 * t;
#pragma unroll
  for (int nt = 0; nt < kValueTiles; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<__nv_bfloat162 *>(outRows + (g + 8 * r) * kValueDim + nt * 8) =
          __floats2bfloat162_rn(acc[nt][2 * r] * inverse[r], acc[nt][2 * r + 1] * inverse[r]);
  if (warp == 0 && t == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      lse[token * heads + firstHead + g + 8 * r] =
          runningSum[r] > 0.0f ? runningMax[r] + __logf(runningSum[r]) : negInf;
}

bool aligned16(const at::Tensor &x) { return reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 16 == 0; }

} // namespace

bool sparseLatentForwardTakes(const at::Tensor &q, const at::Tensor &keys, int64_t valueDim) {
  return q.is_cuda() && keys.is_cuda() && q.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
         q.dim() == 4 && q.size(2) % kHeads == 0 && q.size(3) == kKeyDim && q.is_contiguous() && aligned16(q) &&
         keys.dim() == 2 && keys.size(1) == kKeyDim && keys.is_contiguous() && aligned16(keys) &&
         valueDim == kValueDim;
}

void sparseLatentForward(const at::Tensor &q, const at::Tensor &keys, const at::Tensor &indices,
                         const at::Tensor &valid, double scale, int64_t keyLen, int64_t valueDim, at::Tensor &out,
                         at::Tensor &lse) {
  TORCH_CHECK(sparseLatentForwardTakes(q, keys, valueDim), "sparseLatentForward: a layout it does not take");
  const int64_t batch = q.size(0), seqLen = q.size(1), heads = q.size(2);
  checkSelection(q, indices, valid, "sparseLatentForward");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kBFloat16 &&
                  out.sizes() == at::IntArrayRef({batch, seqLen, heads, valueDim}) && lse.is_contiguous() &&
                  lse.scalar_type() == at::kFloat && lse.sizes() == at::IntArrayRef({batch, seqLen, heads}),
              "sparseLatentForward: expected out [B, T, H, Dv] bf16 and lse [B, T, H] fp32, contiguous");
  if (out.numel() == 0)
    return;
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor rows = indices.contiguous(), ok = valid.contiguous();
  static const bool sharedAllowed = (allowSharedBytes(sparseLatentForwardKernel, kSharedBytes), true);
  (void)sharedAllowed;
  const dim3 grid(static_cast<unsigned>(seqLen), static_cast<unsigned>(batch), static_cast<unsigned>(heads / kHeads));
  sparseLatentForwardKernel<<<grid, kWarps * 32, kSharedBytes, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16 *>(q.data_ptr<at::BFloat16>()),
      reinterpret_cast<const __nv_bfloat16 *>(keys.data_ptr<at::BFloat16>()), rows.data_ptr<int64_t>(),
      ok.data_ptr<bool>(), reinterpret_cast<__nv_bfloat16 *>(out.data_ptr<at::BFloat16>()), lse.data_ptr<float>(),
      seqLen, heads, rows.size(2), keyLen, static_cast<float>(scale));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace adapt::rt::cuda
