//===- KimiChunkGradKernel.cu - Kimi's chunk gradients in one kernel ------===//
//
// A block of 256 threads (8 warps) per chunk: every operand as a bf16 tile
// in shared memory (rows padded by 8 elements, as the delta rule's other
// kernels), the [64, 128] products a warp per 16 rows and 64 columns, the
// [64, 64] ones a warp per 16 rows and 32 columns, each on the mma
// fragments of runtime/cuda/DeltaRule.cuh. ~197 KiB of shared memory: one
// block per SM.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/KimiChunkGradKernel.h"
#include "runtime/cuda/DeltaRule.cuh"
#include "runtime/cuda/Switches.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <type_traits>

namespace adapt::rt::cuda {

namespace {

using namespace delta;

/// Writes a warp's [16, 64] accumulators at (m0, n0) to the contiguous fp32
/// rows \p out, 128 wide.
__device__ __forceinline__ void storeRows(float *out, const float (&acc)[8][4], int m0, int n0, int g, int t) {
  forPairs<8>(m0, n0, g, t, [&](int nt, int h, int r, int c) {
    *reinterpret_cast<float2 *>(out + r * kDim + c) = make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
  });
}

/// Writes a warp's rows [m0, m0 + 16) and columns [n0, n0 + 64) of T^T \p rhs
/// (T the [64][kSquareRow] tile \p ts, \p rhs a [64][kRow] tile) to the fp32
/// rows \p out: dXk = T^T dW and dXv = T^T dV_new.
__device__ __forceinline__ void storeInverseTransposedTimes(float *out, const bf16 *ts, const bf16 *rhs, int m0, int n0,
                                                            int g, int t, int lane) {
  float acc[8][4];
  zero(acc);
  productAtB<8, kChunk / 16>(acc, ts, kSquareRow, rhs, kRow, m0, n0, lane);
  storeRows(out, acc, m0, n0, g, t);
}

/// Writes a warp's [16, 32] accumulators at (m0, n0) to the contiguous fp32
/// [64, 64] \p out, times \p sign, where column < row (+ \p inclusive), else 0.
__device__ __forceinline__ void storeLower(float *out, const float (&acc)[4][4], int m0, int n0, int g, int t,
                                          bool inclusive, float sign) {
  forPairs<4>(m0, n0, g, t, [&](int nt, int h, int r, int c) {
    const int limit = inclusive ? r + 1 : r;
    *reinterpret_cast<float2 *>(out + r * kChunk + c) =
        make_float2(c < limit ? sign * acc[nt][2 * h] : 0.0f, c + 1 < limit ? sign * acc[nt][2 * h + 1] : 0.0f);
  });
}

/// The outputs, all fp32 contiguous (KimiChunkGrads).
struct ChunkGradOutputs {
  float *queryDecayed, *scores, *keysToEnd, *keysWeighted, *valuesWeighted, *system, *leavingDotState;
};

/// dXv's two uses, taken in the kernel's epilogue when given (else dXv is
/// written, valuesWeighted): v's gradient dXv b (bf16) and beta's value
/// term sum_v dXv v (fp32 [.., 64, 1]), from v's bf16 rows and b.
struct ValueTerms {
  const bf16 *values = nullptr; ///< v [.., 64, 128] bf16
  const float *beta = nullptr;  ///< b [.., 64] fp32
  bf16 *valueGrad = nullptr;    ///< dXv b [.., 64, 128] bf16
  float *betaValues = nullptr;  ///< sum_v dXv v [.., 64]
};

/// Multiplies each row r of the bf16 [64][kRow] \p tile by \p scale[r] in
/// fp32, rounding the product once to bf16 (by a block of 256 threads): the
/// tile a fp32 [64, 128] array of the products would round to.
__device__ __forceinline__ void scaleRows(bf16 *tile, const float *scale) {
  for (int i = threadIdx.x; i < kChunk * kDim / 2; i += blockDim.x) {
    const int r = i / (kDim / 2), c = 2 * (i % (kDim / 2));
    auto *pair = reinterpret_cast<uint32_t *>(tile + r * kRow + c);
    const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(pair));
    const float s = scale[r];
    *pair = packBf16(x.x * s, x.y * s);
  }
}

/// A warp's rows [m0, m0 + 16) and columns [n0, n0 + 64) of dXv = T^T dV_new,
/// turned into v's gradient (dXv b, rounded once to bf16, as a product in
/// fp32 then a cast) and into this warp's half of beta's value term per row
/// (sum over its 64 columns of dXv v, in column order within a lane, then
/// across the four lanes of the row), left in \p halves [half][row].
__device__ __forceinline__ void storeValueTerms(const ValueTerms &vt, int64_t rows0, const bf16 *ts, const bf16 *dns,
                                                int m0, int n0, int g, int t, int lane, int half,
                                                float (*halves)[kChunk]) {
  float acc[8][4];
  zero(acc);
  productAtB<8, kChunk / 16>(acc, ts, kSquareRow, dns, kRow, m0, n0, lane);
  float rowSums[2] = {0.0f, 0.0f};
  forPairs<8>(m0, n0, g, t, [&](int nt, int h, int r, int c) {
    const int64_t at = (rows0 + r) * kDim + c;
    const float b = vt.beta[rows0 + r];
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(vt.values + at));
    *reinterpret_cast<uint32_t *>(vt.valueGrad + at) = packBf16(acc[nt][2 * h] * b, acc[nt][2 * h + 1] * b);
    rowSums[h] += acc[nt][2 * h] * v.x + acc[nt][2 * h + 1] * v.y;
  });
  for (int h = 0; h < 2; ++h) {
    const float sum = rowLanesSum(rowSums[h]);
    if (t == 0)
      halves[half][m0 + g + 8 * h] = sum;
  }
}

/// A block per chunk (blockIdx.x over b·h·n): the products of
/// kimiChunkGradients. \p Grad is dS' and dV_new's type, \p GradOut dO's
/// (each bf16 or fp32).
template <typename Grad, typename GradOut>
__global__ void __launch_bounds__(256)
    kimiChunkGradKernel(const GradOut *gradOut, const bf16 *states, const bf16 *newValues, const Grad *leaving,
                        const Grad *gradNew, const float *keysWeighted, const float *valuesWeighted,
                        const float *inverse, ChunkGradOutputs out, ValueTerms valueTerms, bool async) {
  extern __shared__ __align__(16) unsigned char shared[];
  __shared__ float betaHalves[2][kChunk]; // beta's value term per row, a half of the columns each
  bf16 *dos = reinterpret_cast<bf16 *>(shared); // dO
  bf16 *vns = dos + kChunk * kRow;              // V_new
  bf16 *dns = vns + kChunk * kRow;              // dV_new
  bf16 *xks = dns + kChunk * kRow;              // Xk
  bf16 *xvs = xks + kChunk * kRow;              // Xv
  bf16 *dws = xvs + kChunk * kRow;              // dW = -dV_new S^T
  bf16 *ss = dws + kChunk * kRow;               // S [128][kRow]
  bf16 *dss = ss + kDim * kRow;                 // dS' [128][kRow]
  bf16 *ts = dss + kDim * kRow;                 // T [64][kSquareRow]
  bf16 *dts = ts + kChunk * kSquareRow;         // dT
  bf16 *tdt = dts + kChunk * kSquareRow;        // T^T dT
  const int64_t item = blockIdx.x, rows0 = item * kChunk, state0 = item * kDim * kDim;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int mt = warp % 4, half = warp / 4, m0 = 16 * mt;
  loadBf16(vns, kRow, newValues + rows0 * kDim, kChunk, async);
  loadBf16(ss, kRow, states + state0, kDim, async);
  if constexpr (std::is_same_v<Grad, bf16>) { // cp.async with the above
    loadGrad<kChunk>(dns, kRow, gradNew + rows0 * kDim, async);
    loadGrad<kDim>(dss, kRow, leaving + state0, async);
  }
  if constexpr (std::is_same_v<GradOut, bf16>)
    loadBf16(dos, kRow, gradOut + rows0 * kDim, kChunk, async);
  else
    loadFloatBatched<kChunk, kDim>(dos, kRow, gradOut + rows0 * kDim);
  loadFloatBatched<kChunk, kDim>(xks, kRow, keysWeighted + rows0 * kDim);
  if (valuesWeighted) // else Xv = b v from v's bf16 rows, scaled in place below
    loadFloatBatched<kChunk, kDim>(xvs, kRow, valuesWeighted + rows0 * kDim);
  else
    loadBf16(xvs, kRow, valueTerms.values + rows0 * kDim, kChunk, async);
  loadFloatBatched<kChunk, kChunk>(ts, kSquareRow, inverse + rows0 * kChunk);
  if constexpr (!std::is_same_v<Grad, bf16>) {
    loadGrad<kChunk>(dns, kRow, gradNew + rows0 * kDim, async);
    loadGrad<kDim>(dss, kRow, leaving + state0, async);
  }
  awaitCopies(async);
  __syncthreads();
  if (!valuesWeighted) // Xv = b v, rounded once as the fp32 product's tile is; first read after dW's barrier
    scaleRows(xvs, valueTerms.beta + rows0);

  { // sum over v of dS' . S, a pair of threads per key channel (row)
    const int r = tid / 2, c0 = 2 * (tid % 2);
    float x = 0.0f;
#pragma unroll 8
    for (int c = c0; c < kDim; c += 4) {
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(dss + r * kRow + c));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(ss + r * kRow + c));
      x += a.x * b.x + a.y * b.y;
    }
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    if (tid % 2 == 0)
      out.leavingDotState[item * kDim + r] = x;
  }
  { // dP = dO V_new^T, on and below the diagonal
    float acc[4][4];
    zero(acc);
    productABt<4, kDim / 16>(acc, dos, kRow, vns, kRow, m0, 32 * half, g, t);
    storeLower(out.scores + rows0 * kChunk, acc, m0, 32 * half, g, t, /*inclusive=*/true, 1.0f);
  }
  { // dQd = dO S^T
    float acc[8][4];
    zero(acc);
    productABt<8, kDim / 16>(acc, dos, kRow, ss, kRow, m0, 64 * half, g, t);
    storeRows(out.queryDecayed + rows0 * kDim, acc, m0, 64 * half, g, t);
  }
  { // dW = -dV_new S^T, to shared memory for dT and dXk
    float acc[8][4];
    zero(acc);
    productABt<8, kDim / 16>(acc, dns, kRow, ss, kRow, m0, 64 * half, g, t);
    forPairs<8>(m0, 64 * half, g, t, [&](int nt, int h, int r, int c) {
      *reinterpret_cast<uint32_t *>(dws + r * kRow + c) = packBf16(-acc[nt][2 * h], -acc[nt][2 * h + 1]);
    });
  }
  { // dKd = V_new dS'^T
    float acc[8][4];
    zero(acc);
    productABt<8, kDim / 16>(acc, vns, kRow, dss, kRow, m0, 64 * half, g, t);
    storeRows(out.keysToEnd + rows0 * kDim, acc, m0, 64 * half, g, t);
  }
  if (valueTerms.values) // dXv's two uses, from its accumulators
    storeValueTerms(valueTerms, rows0, ts, dns, m0, 64 * half, g, t, lane, half, betaHalves);
  else
    storeInverseTransposedTimes(out.valuesWeighted + rows0 * kDim, ts, dns, m0, 64 * half, g, t, lane); // dXv
  __syncthreads(); // dW in place (and beta's halves)
  if (valueTerms.values && tid < kChunk)
    valueTerms.betaValues[rows0 + tid] = betaHalves[0][tid] + betaHalves[1][tid];
  { // dT = dW Xk^T + dV_new Xv^T
    float acc[4][4];
    zero(acc);
    productABt<4, kDim / 16>(acc, dws, kRow, xks, kRow, m0, 32 * half, g, t);
    productABt<4, kDim / 16>(acc, dns, kRow, xvs, kRow, m0, 32 * half, g, t);
    forTile<4>(m0, 32 * half, g, t,
               [&](int nt, int i, int r, int c) { dts[r * kSquareRow + c] = __float2bfloat16(acc[nt][i]); });
  }
  storeInverseTransposedTimes(out.keysWeighted + rows0 * kDim, ts, dws, m0, 64 * half, g, t, lane); // dXk
  __syncthreads(); // dT in place
  { // T^T dT
    float acc[4][4];
    zero(acc);
    productAtB<4, kChunk / 16>(acc, ts, kSquareRow, dts, kSquareRow, m0, 32 * half, lane);
    forTile<4>(m0, 32 * half, g, t,
               [&](int nt, int i, int r, int c) { tdt[r * kSquareRow + c] = __float2bfloat16(acc[nt][i]); });
  }
  __syncthreads(); // T^T dT in place
  { // dA = -(T^T dT) T^T, strictly below the diagonal
    float acc[4][4];
    zero(acc);
    productABt<4, kChunk / 16>(acc, tdt, kSquareRow, ts, kSquareRow, m0, 32 * half, g, t);
    storeLower(out.system + rows0 * kChunk, acc, m0, 32 * half, g, t, /*inclusive=*/false, -1.0f);
  }
}

constexpr size_t kSharedBytes =
    ((6 * kChunk + 2 * kDim) * kRow + 3 * kChunk * kSquareRow) * sizeof(bf16);

} // namespace

bool kimiChunkGradientsEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_CHUNK_GRAD_KERNEL");
  return on;
}

bool kimiValueTermsEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_VALUE_TERMS");
  return on;
}

bool kimiBf16RowsEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_BF16_ROWS");
  return on;
}

bool kimiBf16OperandsEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_BF16_OPERANDS");
  return on;
}

bool kimiChunkGradientsTake(const at::Tensor &gradOut, const at::Tensor &states) {
  return gradOut.is_cuda() && (gradOut.scalar_type() == at::kFloat || gradOut.scalar_type() == at::kBFloat16) &&
         gradOut.dim() == 5 &&
         gradOut.size(3) == kChunk && gradOut.size(4) == kDim && states.scalar_type() == at::kBFloat16 &&
         states.dim() == 5 && states.sizes().slice(0, 3) == gradOut.sizes().slice(0, 3) && states.size(3) == kDim &&
         states.size(4) == kDim;
}

KimiChunkGrads kimiChunkGradients(const at::Tensor &gradOut, const at::Tensor &states, const at::Tensor &newValues,
                                  const at::Tensor &leaving, const at::Tensor &gradNew, const at::Tensor &keysWeighted,
                                  const at::Tensor &valuesWeighted, const at::Tensor &inverse, const at::Tensor &values,
                                  const at::Tensor &beta) {
  TORCH_CHECK(kimiChunkGradientsTake(gradOut, states) &&
                  (leaving.scalar_type() == at::kBFloat16 || leaving.scalar_type() == at::kFloat),
              "kimiChunkGradients: expected a bf16 or fp32 dO [b, h, n, 64, 128], bf16 states [b, h, n, 128, 128] "
              "and a bf16 or fp32 dS' on CUDA");
  const at::IntArrayRef chunks = gradOut.sizes().slice(0, 3);
  const at::ScalarType gradType = leaving.scalar_type();
  auto expect = [&](const at::Tensor &x, const char *name, at::ScalarType dtype, int64_t rows, int64_t width) {
    TORCH_CHECK(x.dim() == 5 && x.sizes().slice(0, 3) == chunks && x.size(3) == rows && x.size(4) == width &&
                    x.scalar_type() == dtype && x.device() == gradOut.device(),
                "kimiChunkGradients: expected ", name, " ", c10::toString(dtype), " [", chunks, ", ", rows, ", ",
                width, "], found ", c10::toString(x.scalar_type()), " ", x.sizes());
    return x.contiguous();
  };
  const at::Tensor dO = expect(gradOut, "dO", gradOut.scalar_type(), kChunk, kDim);
  const at::TensorOptions f32 = dO.options().dtype(at::kFloat);
  const at::Tensor s = expect(states, "S", at::kBFloat16, kDim, kDim);
  const at::Tensor vNew = expect(newValues, "V_new", at::kBFloat16, kChunk, kDim);
  const at::Tensor dS = expect(leaving, "dS'", gradType, kDim, kDim);
  const at::Tensor dVNew = expect(gradNew, "dV_new", gradType, kChunk, kDim);
  const at::Tensor xk = expect(keysWeighted, "Xk", at::kFloat, kChunk, kDim);
  TORCH_CHECK(valuesWeighted.defined() || values.defined(), "kimiChunkGradients: expected Xv or v and beta");
  const at::Tensor xv =
      valuesWeighted.defined() ? expect(valuesWeighted, "Xv", at::kFloat, kChunk, kDim) : at::Tensor();
  const at::Tensor t = expect(inverse, "T", at::kFloat, kChunk, kChunk);
  const c10::cuda::CUDAGuard guard(gradOut.device());
  KimiChunkGrads r;
  r.queryDecayed = at::empty(dO.sizes(), f32);
  r.keysToEnd = at::empty_like(r.queryDecayed);
  r.keysWeighted = at::empty_like(r.queryDecayed);
  ValueTerms valueTerms;
  at::Tensor v, b;
  if (values.defined()) { // dXv's two uses in the kernel, dXv itself never written
    v = expect(values, "v", at::kBFloat16, kChunk, kDim);
    TORCH_CHECK(beta.numel() == v.numel() / kDim && beta.scalar_type() == at::kFloat && beta.device() == v.device(),
                "kimiChunkGradients: expected beta fp32 [.., 64, 1] beside v ", v.sizes(), ", found ", beta.sizes());
    b = beta.contiguous();
    r.values = at::empty(v.sizes(), v.options());
    r.betaValues = at::empty(b.sizes(), f32);
    valueTerms = {bf16Data(v), b.data_ptr<float>(), bf16Data(r.values), r.betaValues.data_ptr<float>()};
  } else {
    r.valuesWeighted = at::empty_like(r.queryDecayed);
  }
  r.scores = at::empty(t.sizes(), f32);
  r.system = at::empty_like(r.scores);
  r.leavingDotState = at::empty({chunks[0], chunks[1], chunks[2], 1, kDim}, f32);
  const int64_t items = dO.numel() / (kChunk * kDim);
  if (items == 0)
    return r;
  TORCH_CHECK(items <= 0x7fffffff, "kimiChunkGradients: at most 2^31 - 1 chunks, got ", items);
  const ChunkGradOutputs out{r.queryDecayed.data_ptr<float>(), r.scores.data_ptr<float>(),
                             r.keysToEnd.data_ptr<float>(),    r.keysWeighted.data_ptr<float>(),
                             values.defined() ? nullptr : r.valuesWeighted.data_ptr<float>(), r.system.data_ptr<float>(),
                             r.leavingDotState.data_ptr<float>()};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool async = asyncLoads();
  auto launch = [&](auto kernel, const auto *gradOutData, const auto *leavingData, const auto *gradNewData) {
    allowSharedMemory(kernel, kSharedBytes);
    kernel<<<static_cast<unsigned>(items), 256, kSharedBytes, stream>>>(
        gradOutData, bf16Data(s), bf16Data(vNew), leavingData, gradNewData, xk.data_ptr<float>(),
        xv.defined() ? xv.data_ptr<float>() : nullptr, t.data_ptr<float>(), out, valueTerms, async);
  };
  const bool bf16Out = dO.scalar_type() == at::kBFloat16;
  if (gradType == at::kBFloat16 && bf16Out)
    launch(kimiChunkGradKernel<bf16, bf16>, bf16Data(dO), bf16Data(dS), bf16Data(dVNew));
  else if (gradType == at::kBFloat16)
    launch(kimiChunkGradKernel<bf16, float>, dO.data_ptr<float>(), bf16Data(dS), bf16Data(dVNew));
  else if (bf16Out)
    launch(kimiChunkGradKernel<float, bf16>, bf16Data(dO), dS.data_ptr<float>(), dVNew.data_ptr<float>());
  else
    launch(kimiChunkGradKernel<float, float>, dO.data_ptr<float>(), dS.data_ptr<float>(), dVNew.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return r;
}

} // namespace adapt::rt::cuda
