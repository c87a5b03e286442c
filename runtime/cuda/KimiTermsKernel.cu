//===- KimiTermsKernel.cu - Kimi's backward terms in one pass -------------===//
//
// See KimiTermsKernel.h. A grid-stride loop over float4 groups of the
// [rows, d] view: each group reads its q, k and G, its row's beta and the
// chunk's last G for its columns (shared by the chunk's 64 rows, an L1/L2
// hit after the first), and writes the four products.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/KimiTermsKernel.h"
#include "runtime/cuda/Switches.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty_like.h>
#include <cuda_bf16.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <type_traits>

namespace adapt::rt::cuda {

namespace {

__device__ __forceinline__ float4 operator*(float4 a, float4 b) { return {a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w}; }
__device__ __forceinline__ float4 operator*(float4 a, float s) { return {a.x * s, a.y * s, a.z * s, a.w * s}; }
__device__ __forceinline__ float4 expOf(float4 a) { return {expf(a.x), expf(a.y), expf(a.z), expf(a.w)}; }
__device__ __forceinline__ float4 expOfDifference(float4 a, float4 b) {
  return {expf(a.x - b.x), expf(a.y - b.y), expf(a.z - b.z), expf(a.w - b.w)};
}

/// Four fp32 values as four bf16, each rounded to nearest even as
/// at::Tensor::to's cast rounds them: 8 bytes.
struct __align__(8) Bf16Quad {
  __nv_bfloat162 low, high;
  __device__ __forceinline__ Bf16Quad(float4 v)
      : low(__floats2bfloat162_rn(v.x, v.y)), high(__floats2bfloat162_rn(v.z, v.w)) {}
};

/// Float4 group \p e of fp32 rows.
__device__ __forceinline__ float4 quadAt(const float *x, int64_t e) { return reinterpret_cast<const float4 *>(x)[e]; }

/// Float4 group \p e of bf16 rows, widened exactly.
__device__ __forceinline__ float4 quadAt(const __nv_bfloat16 *x, int64_t e) {
  const uint2 raw = reinterpret_cast<const uint2 *>(x)[e];
  const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
  const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
  return {low.x, low.y, high.x, high.y};
}

/// The four terms over \p groups float4 groups, \p quads groups a row,
/// \p chunk rows a chunk; the decayed keys and queries stored as \p
/// Decayed (float4, or Bf16Quad for the state pass's bf16 operands). q and k
/// are \p In: fp32 (q already scaled), or bf16 as the node's inputs (q times
/// \p queryScale here, as the fp32 copy's product). k b is written when \p
/// keysBeta is given.
template <typename Decayed, typename In>
__global__ void __launch_bounds__(256)
    kimiTermsKernel(const In *query, const In *key, const float *beta, const float4 *cum, int chunk, int quads,
                    int64_t groups, float queryScale, float4 *keysBeta, float4 *keysWeighted, Decayed *keysToEnd,
                    Decayed *queryDecayed) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < groups; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / quads, lastRow = row - row % chunk + chunk - 1;
    const float4 g = cum[e], last = cum[lastRow * quads + e % quads], k = quadAt(key, e);
    float4 q = quadAt(query, e);
    if constexpr (std::is_same_v<In, __nv_bfloat16>)
      q = q * queryScale;
    const float4 decay = expOf(g), leave = expOfDifference(last, g), kb = k * beta[row];
    if (keysBeta)
      keysBeta[e] = kb;
    keysWeighted[e] = kb * decay;
    keysToEnd[e] = Decayed(k * leave);
    queryDecayed[e] = Decayed(q * decay);
  }
}

} // namespace

bool kimiFusedTermsEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_FUSED_TERMS");
  return on;
}

bool kimiFusedTermsTake(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                        const at::Tensor &cum) {
  if (!cum.is_cuda() || cum.dim() < 2 || cum.scalar_type() != at::kFloat || !cum.is_contiguous())
    return false;
  const at::ScalarType rows = key.scalar_type();
  if (rows != at::kFloat && rows != at::kBFloat16)
    return false;
  for (const at::Tensor *t : {&query, &key})
    if (t->device() != cum.device() || t->scalar_type() != rows || !t->is_contiguous() || t->sizes() != cum.sizes())
      return false;
  for (const at::Tensor *t : {&query, &key, &cum}) // float4 groups: 16 bytes in fp32, 8 in bf16
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % (t->scalar_type() == at::kFloat ? 16 : 8) != 0)
      return false;
  const int64_t c = cum.size(-2), d = cum.size(-1);
  return c > 0 && d % 4 == 0 && beta.device() == cum.device() && beta.scalar_type() == at::kFloat &&
         beta.is_contiguous() && beta.numel() * d == cum.numel() && beta.size(-1) == 1 && beta.size(-2) == c;
}

KimiTermTensors kimiFusedTerms(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                               const at::Tensor &cum, bool bf16Decayed, double queryScale) {
  TORCH_CHECK(kimiFusedTermsTake(query, key, beta, cum),
              "kimiFusedTerms: expected CUDA contiguous q, k (both fp32 or both bf16) and fp32 cum [.., c, d] (d a "
              "multiple of 4) and beta [.., c, 1]");
  const bool bf16Rows = key.scalar_type() == at::kBFloat16;
  const at::TensorOptions f32 = cum.options(), decayedOptions = bf16Decayed ? f32.dtype(at::kBFloat16) : f32;
  KimiTermTensors t{bf16Rows ? at::Tensor() : at::empty_like(cum), at::empty_like(cum),
                    at::empty_like(cum, decayedOptions), at::empty_like(cum, decayedOptions)};
  const int64_t groups = cum.numel() / 4;
  if (groups == 0)
    return t;
  const c10::cuda::CUDAGuard guard(cum.device());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((groups + 255) / 256, int64_t(sms) * 8));
  const auto out = [](at::Tensor &x) { return x.defined() ? reinterpret_cast<float4 *>(x.data_ptr<float>()) : nullptr; };
  const auto outBf16 = [](at::Tensor &x) { return reinterpret_cast<Bf16Quad *>(x.data_ptr<at::BFloat16>()); };
  const auto bf16In = [](const at::Tensor &x) {
    return reinterpret_cast<const __nv_bfloat16 *>(x.data_ptr<at::BFloat16>());
  };
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int chunk = static_cast<int>(cum.size(-2)), quads = static_cast<int>(cum.size(-1) / 4);
  const auto *g = reinterpret_cast<const float4 *>(cum.data_ptr<float>());
  const float *b = beta.data_ptr<float>();
  const auto scale = static_cast<float>(queryScale);
  auto launch = [&](auto kernel, const auto *q, const auto *k, auto *keysToEnd, auto *queryDecayed) {
    kernel<<<blocks, 256, 0, stream>>>(q, k, b, g, chunk, quads, groups, scale, out(t.keysBeta), out(t.keysWeighted),
                                       keysToEnd, queryDecayed);
  };
  if (bf16Rows && bf16Decayed)
    launch(kimiTermsKernel<Bf16Quad, __nv_bfloat16>, bf16In(query), bf16In(key), outBf16(t.keysToEnd),
           outBf16(t.queryDecayed));
  else if (bf16Rows)
    launch(kimiTermsKernel<float4, __nv_bfloat16>, bf16In(query), bf16In(key), out(t.keysToEnd), out(t.queryDecayed));
  else if (bf16Decayed)
    launch(kimiTermsKernel<Bf16Quad, float>, query.data_ptr<float>(), key.data_ptr<float>(), outBf16(t.keysToEnd),
           outBf16(t.queryDecayed));
  else
    launch(kimiTermsKernel<float4, float>, query.data_ptr<float>(), key.data_ptr<float>(), out(t.keysToEnd),
           out(t.queryDecayed));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return t;
}

} // namespace adapt::rt::cuda
