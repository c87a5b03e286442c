//===- RouteKernel.cu - a MoE router's top-k and weights in one kernel ----===//
//
// One warp per token; lane l holds experts l, l + 32, ... in registers
// (kPerLane of them, a compile-time bound). Each selection round takes every
// lane's best untaken candidate and reduces (value, index) over the warp,
// the larger value winning and, on equal values, the lower index. Lane j
// ends holding the j-th chosen expert and its weight.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/RouteKernel.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <climits>

namespace adapt::rt::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTokensPerBlock = kThreads / 32;

/// The device-side spec.
struct Spec {
  int experts, topK, groups, topKGroups;
  bool sigmoid, norm;
  float scaling;
};

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// (value, index) of the warp's best: larger value, then lower index.
__device__ __forceinline__ void warpArgMax(float &value, int &index) {
  for (int o = 16; o > 0; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, value, o);
    const int i = __shfl_xor_sync(0xffffffffu, index, o);
    if (v > value || (v == value && i < index))
      value = v, index = i;
  }
}

/// The warp's best (value, index) among the lanes' experts e (slot i) that
/// \p accept(e, i) takes: larger value, then lower index.
template <int N, typename Accept>
__device__ __forceinline__ void warpBest(const float (&value)[N], int lane, int experts, const Accept &accept,
                                         float &best, int &bestIndex) {
  best = -INFINITY;
  bestIndex = INT_MAX;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = lane + 32 * i;
    if (e < experts && accept(e, i) && (value[i] > best || (value[i] == best && e < bestIndex)))
      best = value[i], bestIndex = e;
  }
  warpArgMax(best, bestIndex);
}

/// slot \p s of a register array, \p s warp-uniform.
template <int N> __device__ __forceinline__ float pick(const float (&a)[N], int s) {
  float r = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i == s)
      r = a[i];
  return r;
}

/// Each lane's scores (softmax probabilities or sigmoids) of its experts;
/// experts past E get 0.
template <int N>
__device__ __forceinline__ void scoresOf(const float *row, const Spec &s, int lane, float (&score)[N]) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < s.experts ? row[e] : -INFINITY;
    mx = fmaxf(mx, score[i]);
  }
  if (s.sigmoid) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      score[i] = lane + 32 * i < s.experts ? 1.0f / (1.0f + expf(-score[i])) : 0.0f;
    return;
  }
  mx = warpMax(mx);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    score[i] = lane + 32 * i < s.experts ? expf(score[i] - mx) : 0.0f;
    sum += score[i];
  }
  const float inv = 1.0f / warpSum(sum);
#pragma unroll
  for (int i = 0; i < N; ++i)
    score[i] *= inv;
}

template <int N, typename B>
__global__ void routeForwardKernel(const float *__restrict__ logits, const B *__restrict__ bias,
                                   int64_t *__restrict__ expertsOut, float *__restrict__ weightsOut, int64_t tokens,
                                   Spec s) {
  const int lane = threadIdx.x % 32;
  const int64_t token = blockIdx.x * int64_t(kTokensPerBlock) + threadIdx.x / 32;
  if (token >= tokens)
    return;
  float score[N], choice[N];
  scoresOf(logits + token * s.experts, s, lane, score);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = lane + 32 * i;
    choice[i] = e < s.experts ? score[i] + (bias ? static_cast<float>(bias[e]) : 0.0f) : -INFINITY;
  }
  if (s.groups > 1) { // keep the topKGroups groups of the largest top-2 sums; the rest choose 0
    const int per = s.experts / s.groups;
    unsigned kept = 0;
    float groupScore = -INFINITY; // lane g holds group g's score
    for (int g = 0; g < s.groups; ++g) {
      float best, second;
      int bestIndex, secondIndex;
      warpBest(choice, lane, s.experts, [&](int e, int) { return e / per == g; }, best, bestIndex);
      warpBest(choice, lane, s.experts, [&](int e, int) { return e / per == g && e != bestIndex; }, second,
               secondIndex);
      if (lane == g)
        groupScore = per > 1 ? best + second : best;
    }
    for (int round = 0; round < s.topKGroups; ++round) {
      float v = (kept >> lane) & 1u ? -INFINITY : groupScore;
      int index = lane < s.groups && !((kept >> lane) & 1u) ? lane : INT_MAX;
      if (lane >= s.groups)
        v = -INFINITY;
      warpArgMax(v, index);
      kept |= 1u << index;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int e = lane + 32 * i;
      if (e < s.experts && !((kept >> (e / per)) & 1u))
        choice[i] = 0.0f;
    }
  }
  unsigned taken = 0;
  int myExpert = 0;
  float myWeight = 0.0f;
  for (int j = 0; j < s.topK; ++j) {
    float best;
    int bestIndex;
    warpBest(choice, lane, s.experts, [&](int, int i) { return !((taken >> i) & 1u); }, best, bestIndex);
    const int slot = bestIndex / 32;
    if (lane == bestIndex % 32)
      taken |= 1u << slot;
    const float w = __shfl_sync(0xffffffffu, pick(score, slot), bestIndex % 32);
    if (lane == j)
      myExpert = bestIndex, myWeight = w;
  }
  const bool mine = lane < s.topK;
  if (s.norm) {
    const float sum = warpSum(mine ? myWeight : 0.0f);
    myWeight = s.sigmoid ? myWeight / (sum + 1e-20f) : myWeight / sum;
  }
  if (mine) {
    expertsOut[token * s.topK + lane] = myExpert;
    weightsOut[token * s.topK + lane] = myWeight * s.scaling;
  }
}

template <int N>
__global__ void routeBackwardKernel(const float *__restrict__ logits, const int64_t *__restrict__ experts,
                                    const float *__restrict__ gradWeights, float *__restrict__ gradLogits,
                                    int64_t tokens, Spec s) {
  const int lane = threadIdx.x % 32;
  const int64_t token = blockIdx.x * int64_t(kTokensPerBlock) + threadIdx.x / 32;
  if (token >= tokens)
    return;
  float score[N];
  scoresOf(logits + token * s.experts, s, lane, score);
  const bool mine = lane < s.topK;
  const int myExpert = mine ? static_cast<int>(experts[token * s.topK + lane]) : 0;
  const float myGrad = mine ? gradWeights[token * s.topK + lane] : 0.0f;
  float myScore = 0.0f;
  for (int j = 0; j < s.topK; ++j) {
    const int e = __shfl_sync(0xffffffffu, myExpert, j);
    const float v = __shfl_sync(0xffffffffu, pick(score, e / 32), e % 32);
    if (lane == j)
      myScore = v;
  }
  // w_j = c * p_j / S (normalised) or c * p_j: the scores' gradient.
  float gScore = s.scaling * myGrad;
  if (s.norm) {
    const float sum = warpSum(mine ? myScore : 0.0f) + (s.sigmoid ? 1e-20f : 0.0f);
    const float dot = warpSum(mine ? myGrad * myScore : 0.0f);
    gScore = s.scaling * (myGrad / sum - dot / (sum * sum));
  }
  float grad[N];
  if (s.sigmoid) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      grad[i] = 0.0f;
  } else { // softmax: d l_e = p_e (g_e - sum_j g_j p_j), g zero off the chosen
    const float dot = warpSum(mine ? gScore * myScore : 0.0f);
#pragma unroll
    for (int i = 0; i < N; ++i)
      grad[i] = -score[i] * dot;
  }
  for (int j = 0; j < s.topK; ++j) {
    const int e = __shfl_sync(0xffffffffu, myExpert, j);
    const float g = __shfl_sync(0xffffffffu, gScore, j);
    if (lane == e % 32) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i == e / 32)
          grad[i] += s.sigmoid ? g * score[i] * (1.0f - score[i]) : g * score[i];
    }
  }
  float *out = gradLogits + token * s.experts;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i < s.experts)
      out[lane + 32 * i] = grad[i];
}

Spec deviceSpec(const RouteSpec &r, int64_t experts) {
  return {static_cast<int>(experts), static_cast<int>(r.topK), static_cast<int>(r.groups),
          static_cast<int>(r.topKGroups), r.sigmoid, r.normTopK, static_cast<float>(r.scaling)};
}

/// Runs \p body with the compile-time experts-per-lane bound for E.
template <typename Body> void withPerLane(int64_t experts, const Body &body) {
  if (experts <= 32)
    body(std::integral_constant<int, 1>());
  else if (experts <= 64)
    body(std::integral_constant<int, 2>());
  else if (experts <= 128)
    body(std::integral_constant<int, 4>());
  else if (experts <= 256)
    body(std::integral_constant<int, 8>());
  else if (experts <= 512)
    body(std::integral_constant<int, 16>());
  else
    body(std::integral_constant<int, 32>());
}

unsigned blocksFor(int64_t tokens) { return static_cast<unsigned>((tokens + kTokensPerBlock - 1) / kTokensPerBlock); }

} // namespace

bool routeKernelFits(const at::Tensor &logits, const RouteSpec &spec) {
  if (!logits.is_cuda() || logits.scalar_type() != at::kFloat || logits.dim() != 2 || logits.size(0) == 0)
    return false;
  const int64_t experts = logits.size(1);
  return experts >= 1 && experts <= 1024 && spec.topK >= 1 && spec.topK <= 32 && spec.topK <= experts &&
         spec.groups >= 1 && spec.groups <= 32 && experts % spec.groups == 0 && spec.topKGroups >= 1 &&
         spec.topKGroups <= spec.groups && (spec.groups == 1 || spec.sigmoid);
}

std::pair<at::Tensor, at::Tensor> routeForward(const at::Tensor &logits, const at::Tensor &bias,
                                               const RouteSpec &spec) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor l = logits.contiguous(), b = bias.defined() ? bias.contiguous() : at::Tensor();
  const int64_t tokens = l.size(0), experts = l.size(1);
  at::Tensor chosen = at::empty({tokens, spec.topK}, l.options().dtype(at::kLong));
  at::Tensor weights = at::empty({tokens, spec.topK}, l.options());
  const Spec s = deviceSpec(spec, experts);
  const auto stream = at::cuda::getCurrentCUDAStream();
  withPerLane(experts, [&](auto perLane) {
    constexpr int N = decltype(perLane)::value;
    if (!b.defined()) {
      routeForwardKernel<N, float><<<blocksFor(tokens), kThreads, 0, stream>>>(
          l.data_ptr<float>(), nullptr, chosen.data_ptr<int64_t>(), weights.data_ptr<float>(), tokens, s);
      return;
    }
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, b.scalar_type(), "routeForward", [&] {
      routeForwardKernel<N, scalar_t><<<blocksFor(tokens), kThreads, 0, stream>>>(
          l.data_ptr<float>(), b.data_ptr<scalar_t>(), chosen.data_ptr<int64_t>(), weights.data_ptr<float>(),
          tokens, s);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {chosen, weights};
}

at::Tensor routeBackward(const at::Tensor &logits, const at::Tensor &experts, const at::Tensor &gradWeights,
                         const RouteSpec &spec) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor l = logits.contiguous(), chosen = experts.contiguous(),
                   g = gradWeights.to(at::kFloat).contiguous();
  const int64_t tokens = l.size(0), count = l.size(1);
  at::Tensor grad = at::empty_like(l);
  const Spec s = deviceSpec(spec, count);
  withPerLane(count, [&](auto perLane) {
    constexpr int N = decltype(perLane)::value;
    routeBackwardKernel<N><<<blocksFor(tokens), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        l.data_ptr<float>(), chosen.data_ptr<int64_t>(), g.data_ptr<float>(), grad.data_ptr<float>(), tokens, s);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad;
}

} // namespace adapt::rt::cuda
