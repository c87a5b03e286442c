//===- PerChannelScores.cuh - the pieces Kimi's score kernels share -------===//
//
// Kimi delta attention's pairwise score kernels (PerChannelScoresKernel.cu,
// scalar, and PairedScoresMmaKernel.cu, tensor cores below the diagonal):
// the bf16 operands they read, the 16-row blocks they split a chunk into and
// the scalings that make the blocks below the diagonal plain products.
// Included by CUDA sources only.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_PERCHANNELSCORES_CUH
#define ADAPT_RUNTIME_CUDA_PERCHANNELSCORES_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace adapt::rt::cuda::scores {

/// Kimi's q and k as the node's bf16 inputs, for the paired backward in
/// place of its fp32 xA = q scale, y = k and xB = k b (then null): each
/// widened and multiplied in fp32 as the composition's fp32 copies are (k b
/// as the terms kernel forms it). Null \p key: the fp32 operands are read.
struct Bf16Keys {
  const __nv_bfloat16 *query = nullptr, *key = nullptr;
  const float *beta = nullptr; ///< b [items, c]
  float queryScale = 1.0f;
};

/// Widens \p count bf16 values of rows \p width wide (both multiples of 4,
/// \p src 8-byte aligned) into \p dst, each times \p rowScale[row] when
/// given, else times \p scale.
__device__ __forceinline__ void widenRows(float *dst, const __nv_bfloat16 *src, int count, int width, float scale,
                                          const float *rowScale) {
  for (int i = threadIdx.x; i < count / 4; i += blockDim.x) {
    const uint2 raw = reinterpret_cast<const uint2 *>(src)[i];
    const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
    const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
    const float f = rowScale ? rowScale[4 * i / width] : scale;
    reinterpret_cast<float4 *>(dst)[i] = make_float4(low.x * f, low.y * f, high.x * f, high.y * f);
  }
}

constexpr int kSub = 16; ///< Rows per block: the span of the per-term exponentials.

/// The first scratch row of block row \p a's scaled keys (keys 0 .. 16a - 1,
/// a >= 1): 0, 16, 48 for a = 1, 2, 3; blocks(c) rows in all for 8 a (a - 1).
__host__ __device__ constexpr int scaledKeysRow(int a) { return 8 * a * (a - 1); }

/// Fills \p yhat [scaledKeysRow(blocks)][stride]: for each block row a >= 1,
/// the keys i < a0 as y_i e^{G_a0 - G_i}. \p ys and \p gs have row stride
/// \p stride, as \p yhat.
__device__ inline void scaleKeysToBlockRows(const float *ys, const float *gs, int stride, int chunk, int channels,
                                     float *yhat) {
  const int blocks = (chunk + kSub - 1) / kSub, rows = scaledKeysRow(blocks);
  for (int e = threadIdx.x; e < rows * channels; e += blockDim.x) {
    const int v = e / channels, d = e % channels;
    int a = 1;
    while (scaledKeysRow(a + 1) <= v)
      ++a;
    const int i = v - scaledKeysRow(a), a0 = a * kSub;
    yhat[v * stride + d] = ys[i * stride + d] * __expf(gs[a0 * stride + d] - gs[i * stride + d]);
  }
}

/// Scales \p xs's rows t >= kSub in place to their block's first row:
/// x_t e^{G_t - G_a0}. Every reader of the unscaled rows is behind a barrier.
__device__ inline void scaleRowsToBlockStart(float *xs, const float *gs, int stride, int chunk, int channels) {
  for (int e = kSub * channels + threadIdx.x; e < chunk * channels; e += blockDim.x) {
    const int t = e / channels, d = e % channels, a0 = t / kSub * kSub;
    xs[t * stride + d] *= __expf(gs[t * stride + d] - gs[a0 * stride + d]);
  }
}

/// Whether the tensor-core paired backward (PairedScoresMmaKernel.cu) is on:
/// the default since its op checks and memcheck passed on an H100 (session
/// 57); ADAPT_KIMI_SCORES_MMA=0 keeps the scalar kernel.
bool pairedScoresMmaEnabled();

/// Whether the tensor-core paired backward takes chunks of \p chunk rows and
/// \p channels key channels: 64 and 128 (Kimi-Linear's), bf16 keys (8-byte
/// aligned), the cotangents and \p cum 16-byte aligned.
bool pairedScoresMmaTakes(int chunk, int channels, const Bf16Keys &keys, const float *gradA, const float *gradB,
                          const float *cum);

/// The paired backward of \p items chunks (64 x 128) from \p keys' bf16
/// rows, with the blocks below the diagonal as TF32 tensor-core products
/// (fp32 accumulation) and the diagonal blocks as the scalar kernel's:
/// dxA, dxB and dy [items, 64, 128] from the cotangents \p gradA and
/// \p gradB [items, 64, 64] and the cumulative log decays \p cum. All
/// pointers contiguous fp32 on the current device.
void pairedScoresMmaBackward(const float *gradA, const float *gradB, const Bf16Keys &keys, const float *cum,
                             int64_t items, float *dxA, float *dxB, float *dy, cudaStream_t stream);

} // namespace adapt::rt::cuda::scores

#endif // ADAPT_RUNTIME_CUDA_PERCHANNELSCORES_CUH
