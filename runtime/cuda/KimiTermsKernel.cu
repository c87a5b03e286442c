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

/// The four terms over \p groups float4 groups, \p quads groups a row,
/// \p chunk rows a chunk; the decayed keys and queries stored as \p
/// Decayed (float4, or Bf16Quad for the state pass's bf16 operands).
template <typename Decayed>
__global__ void __launch_bounds__(256)
    kimiTermsKernel(const float4 *query, const float4 *key, const float *beta, const float4 *cum, int chunk, int quads,
                    int64_t groups, float4 *keysBeta, float4 *keysWeighted, Decayed *keysToEnd,
                    Decayed *queryDecayed) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < groups; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / quads, lastRow = row - row % chunk + chunk - 1;
    const float4 g = cum[e], last = cum[lastRow * quads + e % quads], k = key[e];
    const float4 decay = expOf(g), leave = expOfDifference(last, g), kb = k * beta[row];
    keysBeta[e] = kb;
    keysWeighted[e] = kb * decay;
    keysToEnd[e] = Decayed(k * leave);
    queryDecayed[e] = Decayed(query[e] * decay);
  }
}

} // namespace

bool kimiFusedTermsEnabled() {
  static const bool on = !switchedOff("ADAPT_KIMI_FUSED_TERMS");
  return on;
}

bool kimiFusedTermsTake(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                        const at::Tensor &cum) {
  if (!key.is_cuda() || key.dim() < 2 || key.scalar_type() != at::kFloat || !key.is_contiguous())
    return false;
  for (const at::Tensor *t : {&query, &cum})
    if (t->device() != key.device() || t->scalar_type() != at::kFloat || !t->is_contiguous() ||
        t->sizes() != key.sizes())
      return false;
  for (const at::Tensor *t : {&query, &key, &cum})
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0)
      return false;
  const int64_t c = key.size(-2), d = key.size(-1);
  return c > 0 && d % 4 == 0 && beta.device() == key.device() && beta.scalar_type() == at::kFloat &&
         beta.is_contiguous() && beta.numel() * d == key.numel() && beta.size(-1) == 1 && beta.size(-2) == c;
}

KimiTermTensors kimiFusedTerms(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                               const at::Tensor &cum, bool bf16Decayed) {
  TORCH_CHECK(kimiFusedTermsTake(query, key, beta, cum),
              "kimiFusedTerms: expected CUDA fp32 contiguous q, k, cum [.., c, d] (d a multiple of 4) and beta [.., c, 1]");
  const at::TensorOptions decayedOptions = bf16Decayed ? key.options().dtype(at::kBFloat16) : key.options();
  KimiTermTensors t{at::empty_like(key), at::empty_like(key), at::empty_like(key, decayedOptions),
                    at::empty_like(key, decayedOptions)};
  const int64_t groups = key.numel() / 4;
  if (groups == 0)
    return t;
  const c10::cuda::CUDAGuard guard(key.device());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((groups + 255) / 256, int64_t(sms) * 8));
  const auto f4 = [](const at::Tensor &x) { return reinterpret_cast<const float4 *>(x.data_ptr<float>()); };
  const auto out = [](at::Tensor &x) { return reinterpret_cast<float4 *>(x.data_ptr<float>()); };
  const auto outBf16 = [](at::Tensor &x) { return reinterpret_cast<Bf16Quad *>(x.data_ptr<at::BFloat16>()); };
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int chunk = static_cast<int>(key.size(-2)), quads = static_cast<int>(key.size(-1) / 4);
  if (bf16Decayed)
    kimiTermsKernel<Bf16Quad><<<blocks, 256, 0, stream>>>(f4(query), f4(key), beta.data_ptr<float>(), f4(cum), chunk,
                                                          quads, groups, out(t.keysBeta), out(t.keysWeighted),
                                                          outBf16(t.keysToEnd), outBf16(t.queryDecayed));
  else
    kimiTermsKernel<float4><<<blocks, 256, 0, stream>>>(f4(query), f4(key), beta.data_ptr<float>(), f4(cum), chunk,
                                                        quads, groups, out(t.keysBeta), out(t.keysWeighted),
                                                        out(t.keysToEnd), out(t.queryDecayed));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return t;
}

} // namespace adapt::rt::cuda
