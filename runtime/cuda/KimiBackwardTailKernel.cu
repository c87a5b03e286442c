//===- KimiBackwardTailKernel.cu - Kimi's backward sums in one pass -------===//
//
// A block of 128 threads per chunk, thread d on key channel d, down the
// chunk's rows: each row's loads are 128 consecutive floats per tensor. The
// beta sums reduce across the channels by warp shuffles and then across the
// four warps in shared memory; the chunk-end sums stay in a register per
// channel.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/KimiBackwardTailKernel.h"
#include "runtime/cuda/Switches.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>

#include <vector>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 128; ///< One per key channel (dk <= 128).
constexpr int kMaxChunk = 64;

/// The nine chunk tensors' data, all [items, c, dk] contiguous, and beta's.
struct TailInputs {
  const float *q, *k, *cum, *dqScores, *dQueryDecayed, *dKeysBeta, *dkColumns, *dXk, *dKeysToEnd;
  const float *beta; ///< [items, c]
  /// q and k as the node's bf16 inputs, in place of q and k (then null):
  /// q's value is float(q) times the kernel's scale, as the fp32 copy's.
  const __nv_bfloat16 *queryRows = nullptr, *keyRows = nullptr;
};

/// The sums of kimiBackwardTail, a block per chunk; dq and dk written as
/// \p Out (fp32, or bf16: the inputs' dtype, sparing the casts after).
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    kimiBackwardTailKernel(TailInputs in, int chunk, int channels, float scale, Out *dq, Out *dKey, float *dCum,
                           float *betaKeys, float *keysToEndSums, const float *leavingDotState) {
  __shared__ float rowSums[kMaxChunk];
  const int d = threadIdx.x, lane = d % 32;
  const bool active = d < channels;
  const int64_t item = blockIdx.x, base = item * chunk * channels;
  for (int i = d; i < chunk; i += blockDim.x)
    rowSums[i] = 0.0f;
  __syncthreads();
  const float last = active ? in.cum[base + int64_t(chunk - 1) * channels + d] : 0.0f;
  // With leavingDotState the rows go last to first and dCum gets their
  // suffix sums (the log decays' gradient, but for the chunk's last terms).
  const bool suffix = leavingDotState != nullptr;
  float columnSum = 0.0f, suffixSum = 0.0f;
  for (int step = 0; step < chunk; ++step) {
    const int i = suffix ? chunk - 1 - step : step;
    const int64_t at = base + int64_t(i) * channels + d;
    const float b = in.beta[item * chunk + i];
    float betaPart = 0.0f;
    if (active) {
      const float g = in.cum[at], gamma = __expf(g), toEnd = __expf(last - g);
      const float q = in.queryRows ? __bfloat162float(in.queryRows[at]) * scale : in.q[at];
      const float k = in.keyRows ? __bfloat162float(in.keyRows[at]) : in.k[at];
      const float dqS = in.dqScores[at], dQD = in.dQueryDecayed[at];
      const float dKB = in.dKeysBeta[at], dkC = in.dkColumns[at], dXk = in.dXk[at], dKE = in.dKeysToEnd[at];
      dq[at] = Out((dqS + dQD * gamma) * scale);
      dKey[at] = Out(dKB * b + dkC + dXk * b * gamma + dKE * toEnd);
      const float keysToEndTerm = dKE * k * toEnd;
      const float gradCum = q * dqS + k * (dKB * b - dkC) + dQD * q * gamma + dXk * k * b * gamma - keysToEndTerm;
      suffixSum += gradCum;
      dCum[at] = suffix ? suffixSum : gradCum;
      betaPart = dKB * k + dXk * k * gamma;
      columnSum += keysToEndTerm;
    }
    for (int offset = 16; offset > 0; offset /= 2)
      betaPart += __shfl_xor_sync(0xffffffffu, betaPart, offset);
    if (lane == 0)
      atomicAdd(&rowSums[i], betaPart);
  }
  __syncthreads();
  for (int i = d; i < chunk; i += blockDim.x)
    betaKeys[item * chunk + i] = rowSums[i];
  if (active && !suffix)
    keysToEndSums[item * channels + d] = columnSum;
  if (active && suffix) { // every row's suffix sum includes the chunk's last G's own gradient
    const float lastGrad = columnSum + leavingDotState[item * channels + d] * __expf(last);
    for (int i = 0; i < chunk; ++i)
      dCum[base + int64_t(i) * channels + d] += lastGrad;
  }
}

} // namespace

bool kimiBackwardTailEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_BACKWARD_TAIL_KERNEL");
  return on;
}

bool kimiTailDecayGradientEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_TAIL_DECAY_GRADIENT");
  return on;
}

bool kimiBackwardTailTakes(const at::Tensor &key) {
  return key.is_cuda() && (key.scalar_type() == at::kFloat || key.scalar_type() == at::kBFloat16) &&
         key.dim() >= 2 && key.size(-2) >= 1 && key.size(-2) <= kMaxChunk && key.size(-1) >= 1 &&
         key.size(-1) <= kThreads;
}

KimiBackwardTail kimiBackwardTail(const at::Tensor &q, const at::Tensor &k, const at::Tensor &cum,
                                  const at::Tensor &beta, const at::Tensor &dqScores, const at::Tensor &dQueryDecayed,
                                  const at::Tensor &dKeysBeta, const at::Tensor &dkColumns,
                                  const at::Tensor &dXk, const at::Tensor &dKeysToEnd, double scale,
                                  const at::Tensor &leavingDotState, at::ScalarType rowsType) {
  TORCH_CHECK(rowsType == at::kFloat || rowsType == at::kBFloat16,
              "kimiBackwardTail: dq and dk go out in fp32 or bf16, not ", c10::toString(rowsType));
  TORCH_CHECK(kimiBackwardTailTakes(k) && q.scalar_type() == k.scalar_type() && q.sizes() == k.sizes() &&
                  q.device() == k.device(),
              "kimiBackwardTail: expected CUDA q and k alike (fp32 or bf16) [.., c <= 64, dk <= 128], found ",
              c10::toString(q.scalar_type()), " ", q.sizes(), " and ", c10::toString(k.scalar_type()), " ", k.sizes());
  const int64_t chunk = k.size(-2), channels = k.size(-1), items = k.numel() / (chunk * channels);
  std::vector<at::Tensor> kept; // contiguous copies where a view was passed
  auto data = [&](const at::Tensor &x, const char *name) {
    TORCH_CHECK(x.sizes() == k.sizes() && x.scalar_type() == at::kFloat && x.device() == k.device(),
                "kimiBackwardTail: expected ", name, " like the keys ", k.sizes(), ", found ", x.sizes());
    kept.push_back(x.contiguous());
    return kept.back().data_ptr<float>();
  };
  TORCH_CHECK(beta.numel() == items * chunk && beta.scalar_type() == at::kFloat && beta.device() == k.device(),
              "kimiBackwardTail: expected beta [.., c, 1] fp32 beside the keys ", k.sizes());
  const c10::cuda::CUDAGuard guard(k.device());
  const at::Tensor b = beta.contiguous();
  const bool bf16Rows = k.scalar_type() == at::kBFloat16;
  auto rows = [&](const at::Tensor &x) { // bf16 q or k, contiguous
    kept.push_back(x.contiguous());
    return reinterpret_cast<const __nv_bfloat16 *>(kept.back().data_ptr<at::BFloat16>());
  };
  TailInputs in{bf16Rows ? nullptr : data(q, "q"), bf16Rows ? nullptr : data(k, "k"), data(cum, "cum"),
                data(dqScores, "dqScores"), data(dQueryDecayed, "dQueryDecayed"),
                data(dKeysBeta, "dKeysBeta"), data(dkColumns, "dkColumns"), data(dXk, "dXk"),
                data(dKeysToEnd, "dKeysToEnd"), b.data_ptr<float>(),
                bf16Rows ? rows(q) : nullptr, bf16Rows ? rows(k) : nullptr};
  KimiBackwardTail r;
  r.query = at::empty(k.sizes(), k.options().dtype(rowsType));
  r.key = at::empty(k.sizes(), k.options().dtype(rowsType));
  r.cum = at::empty(k.sizes(), k.options().dtype(at::kFloat));
  std::vector<int64_t> rowShape(k.sizes().begin(), k.sizes().end()), columnShape = rowShape;
  rowShape.back() = 1;
  columnShape[columnShape.size() - 2] = 1;
  r.betaKeys = at::empty(rowShape, k.options().dtype(at::kFloat));
  const float *leaving = nullptr;
  if (leavingDotState.defined()) { // r.cum is the decays' gradient itself
    TORCH_CHECK(leavingDotState.sizes() == at::IntArrayRef(columnShape) &&
                    leavingDotState.scalar_type() == at::kFloat && leavingDotState.device() == k.device(),
                "kimiBackwardTail: expected leavingDotState fp32 ", at::IntArrayRef(columnShape), ", found ",
                leavingDotState.sizes());
    kept.push_back(leavingDotState.contiguous());
    leaving = kept.back().data_ptr<float>();
    r.decayGradient = true;
  } else {
    r.keysToEndSums = at::empty(columnShape, k.options().dtype(at::kFloat));
  }
  auto launch = [&](auto *dq, auto *dKey) {
    kimiBackwardTailKernel<<<static_cast<unsigned>(items), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in, static_cast<int>(chunk), static_cast<int>(channels), static_cast<float>(scale), dq, dKey,
        r.cum.data_ptr<float>(), r.betaKeys.data_ptr<float>(), leaving ? nullptr : r.keysToEndSums.data_ptr<float>(),
        leaving);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  const auto bf16Out = [](at::Tensor &x) { return reinterpret_cast<__nv_bfloat16 *>(x.data_ptr<at::BFloat16>()); };
  if (items > 0 && rowsType == at::kBFloat16)
    launch(bf16Out(r.query), bf16Out(r.key));
  else if (items > 0)
    launch(r.query.data_ptr<float>(), r.key.data_ptr<float>());
  return r;
}

} // namespace adapt::rt::cuda
