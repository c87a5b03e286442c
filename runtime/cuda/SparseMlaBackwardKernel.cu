//===- SparseMlaBackwardKernel.cu - sparse MLA's backward in one kernel ---===//
//
// The composition's backward (runtime/SparseAttention.cpp) per query block
// gathers the selected latents again, runs five thin batched GEMMs, and
// scatters the rows' gradients with atomics. Here a block of 4 warps per
// (query, 16 heads) does it all from shared memory, per tile of 32 slots:
//   1. gather the slots' latent rows (as the forward);
//   2. warp w, slots [8w, 8w + 8): the logits again (rounded as the
//      forward), P = exp(logit - lse), dP = dO . V^T (rounded to bf16 as the
//      composition's GEMM output), dS = bf16(P (dP - rowDot) scale); dS and
//      bf16(P) go to shared memory;
//   3. dQ += dS . K, warp w owning 144 of the 576 columns (fp32 registers
//      across tiles, rounded once at the end);
//   4. the rows' gradients dS^T Q (+ P^T dO on the first 512 columns), warp
//      w owning 16 slots by 288 columns, added to the fp32 accumulator with
//      16-byte atomics (pairs of lanes swap halves to form 4 columns).
// rowDot = sum(dO * O) per head, as the composition computes it.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/Mma.cuh"
#include "runtime/cuda/Packed.cuh"
#include "runtime/cuda/SparseMla.cuh"
#include "runtime/cuda/SparseMlaKernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

namespace adapt::rt::cuda {

namespace {

using namespace sparse_mla;

constexpr int kSlots = 32;                  ///< Selected rows per tile: 8 per warp.
constexpr int kGradRow = kValueDim + 8;     ///< dO rows: 260 words, distinct banks for g = 0..7.
constexpr int kSlotRow = kSlots + 8;        ///< dS and P rows: 80 bytes, distinct banks for ldmatrix.
constexpr int kQueryColumnsPerWarp = kKeyDim / kWarps; ///< 144: dQ's columns per warp.
constexpr int kQueryTiles = kQueryColumnsPerWarp / 8;  ///< 18 n-tiles.
constexpr int kRowColumnsPerWarp = kKeyDim / 2;        ///< 288: a row gradient's columns per warp.
constexpr size_t kSharedBytes = sizeof(__nv_bfloat16) * (kHeads * kRow + kHeads * kGradRow + kSlots * kRow +
                                                         2 * kHeads * kSlotRow) +
                                sizeof(float) * 2 * kHeads + sizeof(int64_t) * kSlots;

__global__ void __launch_bounds__(kWarps * 32)
    sparseLatentBackwardKernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ keys,
                               const int64_t *__restrict__ indices, const bool *__restrict__ valid,
                               const __nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ gradOut,
                               const float *__restrict__ lse, __nv_bfloat16 *__restrict__ gradQuery,
                               float *__restrict__ gradKeys, int64_t seqLen, int64_t heads, int64_t keep,
                               int64_t keyLen, float scale) {
  extern __shared__ __align__(16) unsigned char shared[];
  __nv_bfloat16 *queryTile = reinterpret_cast<__nv_bfloat16 *>(shared); // [16][kRow]
  __nv_bfloat16 *gradTile = queryTile + kHeads * kRow;                   // [16][kGradRow] dO
  __nv_bfloat16 *rowTile = gradTile + kHeads * kGradRow;                 // [kSlots][kRow]
  __nv_bfloat16 *gradLogitTile = rowTile + kSlots * kRow;                // [16][kSlotRow] dS
  __nv_bfloat16 *probTile = gradLogitTile + kHeads * kSlotRow;           // [16][kSlotRow] P
  float *headLse = reinterpret_cast<float *>(probTile + kHeads * kSlotRow); // [16]
  float *rowDot = headLse + kHeads;                                          // [16]
  int64_t *slotRow = reinterpret_cast<int64_t *>(rowDot + kHeads);          // [kSlots], -1: unused

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int matrix = lane / 8, matrixRow = lane % 8; // ldmatrix: this lane's row address.
  const int64_t batch = blockIdx.y, token = batch * seqLen + blockIdx.x;
  const int64_t firstHead = int64_t(blockIdx.z) * kHeads, headRow = token * heads + firstHead;

  gatherRows(queryTile, q, kHeads, [&](int r) { return headRow + r; });
  for (int v = threadIdx.x; v < kHeads * (kValueDim / 8); v += blockDim.x) {
    const int r = v / (kValueDim / 8), col = (v % (kValueDim / 8)) * 8;
    *reinterpret_cast<uint4 *>(gradTile + r * kGradRow + col) =
        *reinterpret_cast<const uint4 *>(gradOut + (headRow + r) * kValueDim + col);
  }
  // rowDot: warp w sums heads 4w..4w+3 over the 512 value columns.
  for (int h = warp * 4; h < warp * 4 + 4; ++h) {
    float sum = 0.0f;
    for (int c = lane; c < kValueDim; c += 32)
      sum += __bfloat162float(gradOut[(headRow + h) * kValueDim + c]) *
             __bfloat162float(out[(headRow + h) * kValueDim + c]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      rowDot[h] = sum;
      headLse[h] = lse[headRow + h];
    }
  }
  const int64_t *slotIndex = indices + token * keep;
  const bool *slotValid = valid + token * keep;

  float gradQ[kQueryTiles][4];
#pragma unroll
  for (int nt = 0; nt < kQueryTiles; ++nt)
    gradQ[nt][0] = gradQ[nt][1] = gradQ[nt][2] = gradQ[nt][3] = 0.0f;

  for (int64_t firstSlot = 0; firstSlot < keep; firstSlot += kSlots) {
    __syncthreads(); // The previous tile's readers are done; the prologue's tiles are in.
    if (threadIdx.x < kSlots) {
      const int64_t slot = firstSlot + threadIdx.x;
      slotRow[threadIdx.x] =
          slot < keep && slotValid[slot] ? latentRow(batch, keyLen, slotIndex[slot]) : int64_t(-1);
    }
    gatherRows(rowTile, keys, kSlots, [&](int r) {
      const int64_t slot = firstSlot + r;
      return slot < keep ? latentRow(batch, keyLen, slotIndex[slot]) : int64_t(-1);
    });
    __syncthreads();

    // 2. This warp's 8 slots: logits and dP as one n-tile each.
    float logit[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gradProb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const __nv_bfloat16 *slotLatent = rowTile + (warp * 8 + g) * kRow + 2 * t;
#pragma unroll 4
    for (int ks = 0; ks < kKeyDim / 16; ++ks) {
      uint32_t a[4];
      loadFragmentA(a, queryTile, kRow, ks, g, t);
      mma16816(logit, a, bf16Pair(slotLatent + ks * 16), bf16Pair(slotLatent + ks * 16 + 8));
    }
#pragma unroll 4
    for (int ks = 0; ks < kValueDim / 16; ++ks) {
      uint32_t a[4];
      loadFragmentA(a, gradTile, kGradRow, ks, g, t);
      mma16816(gradProb, a, bf16Pair(slotLatent + ks * 16), bf16Pair(slotLatent + ks * 16 + 8));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int head = g + 8 * r;
      float prob[2], gradLogit[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int local = warp * 8 + 2 * t + e;
        const bool use = slotRow[local] >= 0;
        prob[e] = use ? __expf(roundedLogit(logit[2 * r + e], scale) - headLse[head]) : 0.0f;
        const float dp = __bfloat162float(__float2bfloat16_rn(gradProb[2 * r + e]));
        gradLogit[e] = prob[e] * (dp - rowDot[head]) * scale;
      }
      const int at = head * kSlotRow + warp * 8 + 2 * t;
      *reinterpret_cast<__nv_bfloat162 *>(gradLogitTile + at) = __floats2bfloat162_rn(gradLogit[0], gradLogit[1]);
      *reinterpret_cast<__nv_bfloat162 *>(probTile + at) = __floats2bfloat162_rn(prob[0], prob[1]);
    }
    __syncthreads();

    // 3. dQ += dS [16 x 32] . K [32 x this warp's 144 columns].
    addProductWithRows<kSlots>(gradQ, gradLogitTile, kSlotRow, rowTile, warp * kQueryColumnsPerWarp);

    // 4. Rows' gradients: slots [16 (w % 2), +16) by columns [288 (w / 2), +288).
    const int slotBase = (warp % 2) * 16, columnBase = (warp / 2) * kRowColumnsPerWarp;
    uint32_t gradLogitT[4], probT[4]; // A fragments of dS^T and P^T [slots x heads].
    const int transposedAt = ((matrix / 2) * 8 + matrixRow) * kSlotRow + slotBase + (matrix % 2) * 8;
    ldmatrixX4Trans(gradLogitT, gradLogitTile + transposedAt);
    ldmatrixX4Trans(probT, probTile + transposedAt);
    const int headOfLane = (matrix % 2) * 8 + matrixRow, columnOfLane = (matrix / 2) * 8;
    const bool odd = t & 1;
    const int mySlot = slotBase + g + (odd ? 8 : 0);
    const int64_t myRow = slotRow[mySlot];
#pragma unroll 2
    for (int np = 0; np < kRowColumnsPerWarp / 16; ++np) {
      const int c0 = columnBase + np * 16;
      float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      uint32_t b[4];
      ldmatrixX4Trans(b, queryTile + headOfLane * kRow + c0 + columnOfLane);
      mma16816(acc[0], gradLogitT, b[0], b[1]);
      mma16816(acc[1], gradLogitT, b[2], b[3]);
      if (c0 < kValueDim) { // The values' part: P^T dO.
        ldmatrixX4Trans(b, gradTile + headOfLane * kGradRow + c0 + columnOfLane);
        mma16816(acc[0], probT, b[0], b[1]);
        mma16816(acc[1], probT, b[2], b[3]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // Even lanes send their row g + 8 pair and take the partner's row g
        // pair; odd lanes the other way round: 4 adjacent columns each.
        const float send0 = odd ? acc[j][0] : acc[j][2], send1 = odd ? acc[j][1] : acc[j][3];
        const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1), got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
        const float4 four = odd ? make_float4(got0, got1, acc[j][2], acc[j][3])
                                : make_float4(acc[j][0], acc[j][1], got0, got1);
        if (myRow >= 0)
          atomicAddFour(gradKeys + myRow * kKeyDim + c0 + j * 8 + 2 * (t & ~1), four);
      }
    }
  }

  __nv_bfloat16 *gradRows = gradQuery + headRow * kKeyDim + warp * kQueryColumnsPerWarp + 2 * t;
#pragma unroll
  for (int nt = 0; nt < kQueryTiles; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<__nv_bfloat162 *>(gradRows + (g + 8 * r) * kKeyDim + nt * 8) =
          __floats2bfloat162_rn(gradQ[nt][2 * r], gradQ[nt][2 * r + 1]);
}

} // namespace

void sparseLatentBackward(const at::Tensor &q, const at::Tensor &keys, const at::Tensor &indices,
                          const at::Tensor &valid, const at::Tensor &out, const at::Tensor &gradOut,
                          const at::Tensor &lse, double scale, int64_t keyLen, at::Tensor &gradQuery,
                          at::Tensor &gradKeys) {
  TORCH_CHECK(sparseLatentForwardTakes(q, keys, kValueDim), "sparseLatentBackward: a layout it does not take");
  const int64_t batch = q.size(0), seqLen = q.size(1), heads = q.size(2);
  const std::vector<int64_t> valueShape{batch, seqLen, heads, int64_t(kValueDim)};
  checkSelection(q, indices, valid, "sparseLatentBackward");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kBFloat16 && out.sizes() == valueShape &&
                  gradOut.is_contiguous() && gradOut.scalar_type() == at::kBFloat16 && gradOut.sizes() == valueShape &&
                  lse.is_contiguous() && lse.scalar_type() == at::kFloat &&
                  lse.sizes() == at::IntArrayRef({batch, seqLen, heads}),
              "sparseLatentBackward: expected out and dOut [B, T, H, 512] bf16, lse [B, T, H] fp32, contiguous");
  TORCH_CHECK(gradQuery.is_contiguous() && gradQuery.sizes() == q.sizes() &&
                  gradQuery.scalar_type() == at::kBFloat16 && gradKeys.is_contiguous() &&
                  gradKeys.scalar_type() == at::kFloat && gradKeys.dim() == 2 && gradKeys.size(0) == keys.size(0) &&
                  gradKeys.size(1) == kKeyDim,
              "sparseLatentBackward: expected dq like q (bf16) and an fp32 key accumulator like the keys");
  if (q.numel() == 0)
    return;
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor rows = indices.contiguous(), ok = valid.contiguous();
  static const bool sharedAllowed = (allowSharedBytes(sparseLatentBackwardKernel, kSharedBytes), true);
  (void)sharedAllowed;
  const dim3 grid(static_cast<unsigned>(seqLen), static_cast<unsigned>(batch), static_cast<unsigned>(heads / kHeads));
  auto bf16 = [](const at::Tensor &x) { return reinterpret_cast<const __nv_bfloat16 *>(x.data_ptr<at::BFloat16>()); };
  sparseLatentBackwardKernel<<<grid, kWarps * 32, kSharedBytes, at::cuda::getCurrentCUDAStream()>>>(
      bf16(q), bf16(keys), rows.data_ptr<int64_t>(), ok.data_ptr<bool>(), bf16(out), bf16(gradOut),
      lse.data_ptr<float>(), reinterpret_cast<__nv_bfloat16 *>(gradQuery.data_ptr<at::BFloat16>()),
      gradKeys.data_ptr<float>(), seqLen, heads, rows.size(2), keyLen, static_cast<float>(scale));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace adapt::rt::cuda
