//===- LinearAttention.cpp - linear attention's stateless kernels ---------===//

#include "runtime/LinearAttention.h"
#include "runtime/DeltaRuleFunction.h"
#include "runtime/KernelLedger.h"
#include "runtime/KimiDeltaFunction.h"
#include "runtime/Ops.h"
#include "runtime/Recompute.h"
#include "runtime/Tf32Scope.h"

#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/CausalConvKernel.h"
#include "runtime/cuda/GatedNormKernel.h"
#include "runtime/cuda/KimiDeltaKernel.h"
#include "runtime/cuda/L2NormKernel.h"
#endif

#include <ATen/Context.h>
#include <algorithm>
#include <cmath>

namespace adapt::rt {

#ifdef ADAPT_WITH_CUDA_KERNELS
namespace {

/// The convolution + SiLU as one CUDA kernel each way
/// (runtime/cuda/CausalConvKernel.h); backward recomputes the pre-activation.
struct CausalConvSiluNode : torch::autograd::Function<CausalConvSiluNode> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &weight) {
    ctx->save_for_backward({x, weight});
    return cuda::causalConvSilu(x, weight);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = cuda::causalConvSiluBackward(saved[0], saved[1], grads[0], ctx->needs_input_grad(1));
    return {dx, dw.defined() ? dw.reshape(saved[1].sizes()).to(saved[1].scalar_type()) : torch::Tensor()};
  }
};

/// The query and key rows' L2 normalisation as one CUDA kernel each way
/// (runtime/cuda/L2NormKernel.h): keeps x as it lies and each row's 1 / norm.
struct L2NormNode : torch::autograd::Function<L2NormNode> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x, double eps) {
    auto [y, r] = cuda::l2NormForward(x, eps);
    ctx->save_for_backward({x, r});
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {cuda::l2NormBackward(saved[0], saved[1], grads[0]), torch::Tensor()};
  }
};

/// The linear-attention output's gated norm as one CUDA kernel each way
/// (runtime/cuda/GatedNormKernel.h): keeps x, the gate and each row's rstd,
/// where the composition kept several fp32 copies.
struct GatedNormNode : torch::autograd::Function<GatedNormNode> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &weight, const torch::Tensor &gate, double eps, bool sigmoid) {
    const auto kind = sigmoid ? cuda::NormGate::Sigmoid : cuda::NormGate::Silu;
    const torch::Tensor rows = x.contiguous(), gates = gate.contiguous(); // kept as the kernels read them
    auto [y, rstd] = cuda::gatedNormForward(rows, gates, weight, eps, kind);
    ctx->save_for_backward({rows, weight, gates, rstd});
    ctx->saved_data["sigmoid"] = sigmoid;
    return y; // x's shape (the kernels keep it)
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &gate = saved[2], &rstd = saved[3];
    const bool sigmoid = ctx->saved_data["sigmoid"].toBool();
    auto [dx, dg] = cuda::gatedNormBackward(x, gate, weight, rstd, grads[0],
                                            sigmoid ? cuda::NormGate::Sigmoid : cuda::NormGate::Silu);
    torch::Tensor dw;
    if (ctx->needs_input_grad(1)) { // a trained norm weight (not LoRA's case): sum over rows of dy n act(gate)
      const int64_t width = x.size(-1);
      torch::Tensor g = gate.reshape({-1, width}).to(torch::kFloat32);
      torch::Tensor n = x.reshape({-1, width}).to(torch::kFloat32) * rstd.unsqueeze(1);
      dw = (grads[0].reshape({-1, width}).to(torch::kFloat32) * n * (sigmoid ? torch::sigmoid(g) : torch::silu(g)))
               .sum(0)
               .to(weight.scalar_type());
    }
    return {dx, dw, dg, torch::Tensor(), torch::Tensor()};
  }
};

} // namespace
#endif

torch::Tensor causalConv1dSilu(const torch::Tensor &x, const torch::Tensor &weight,
                               const torch::Tensor &previous) {
  if (previous.defined()) { // The previous inputs instead of zero padding.
    const int64_t before = previous.size(1);
    return causalConv1dSilu(torch::cat({previous.to(x.scalar_type()), x}, 1), weight).narrow(1, before, x.size(1));
  }
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("causal_conv1d_silu", x, cuda::causalConvKernelEnabled(), cuda::causalConvTakes(x, weight)))
    return CausalConvSiluNode::apply(x, weight);
#endif
  TORCH_CHECK(x.dim() == 3, "causalConv1dSilu: expected x [B, T, C], got ", x.sizes());
  torch::Tensor w = weight.dim() == 2 ? weight.unsqueeze(1) : weight;
  TORCH_CHECK(w.dim() == 3 && w.size(1) == 1 && w.size(0) == x.size(2),
              "causalConv1dSilu: expected weight [C, 1, K] with C = ", x.size(2), ", got ", weight.sizes());
  const int64_t seqLen = x.size(1), kernel = w.size(2);
  // [B, C, T], left-padded by K - 1 (conv1d pads both sides; keep the first T).
  torch::Tensor out = torch::conv1d(x.transpose(1, 2).to(w.scalar_type()), w, /*bias=*/{}, /*stride=*/1,
                                    /*padding=*/kernel - 1, /*dilation=*/1, /*groups=*/x.size(2));
  out = torch::silu(out.narrow(2, 0, seqLen));
  return out.transpose(1, 2).to(x.scalar_type()).contiguous();
}

torch::Tensor l2Normalize(const torch::Tensor &x, double eps) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("l2_normalize", x, cuda::l2NormKernelEnabled(), cuda::l2NormFits(x)))
    return L2NormNode::apply(x, eps);
#endif
  const auto dtype = x.scalar_type();
  const torch::Tensor h = x.to(at::promote_types(dtype, torch::kFloat32));
  return (h * torch::rsqrt((h * h).sum(-1, /*keepdim=*/true) + eps)).to(dtype);
}

DeltaRuleInputs deltaInputs(const torch::Tensor &query, const torch::Tensor &key, const torch::Tensor &value,
                            const torch::Tensor &decay, const torch::Tensor &beta) {
  return {l2Normalize(query).transpose(1, 2), l2Normalize(key).transpose(1, 2), value.transpose(1, 2),
          decay.transpose(1, 2), beta.transpose(1, 2)};
}

torch::Tensor gatedRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                           const torch::Tensor &gate, double eps) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("gated_rms_norm.silu", x, cuda::gatedNormKernelEnabled(), cuda::gatedNormFits(x, gate, weight)))
    return GatedNormNode::apply(x, weight, gate, eps, /*sigmoid=*/false);
#endif
  const auto dtype = x.scalar_type();
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  h = weight * h.to(dtype);
  h = h * torch::silu(gate.to(torch::kFloat32));
  return h.to(dtype);
}

torch::Tensor sigmoidGatedRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                                  const torch::Tensor &gate, double eps) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("gated_rms_norm.sigmoid", x, cuda::gatedNormKernelEnabled(),
                   cuda::gatedNormFits(x, gate, weight)))
    return GatedNormNode::apply(x, weight, gate, eps, /*sigmoid=*/true);
#endif
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  h = weight.to(torch::kFloat32) * h * torch::sigmoid(gate.to(torch::kFloat32));
  return h.to(x.scalar_type());
}

namespace {

/// The inputs in fp32 with the query scaled and the decay as [B, H, T, G]
/// (G = 1 for a per-head decay, dk per channel).
struct Fp32Inputs {
  torch::Tensor q, k, v, g, beta;
};

/// Rejects inputs of the wrong shapes, naming \p op.
void checkShapes(const DeltaRuleInputs &in, const char *op) {
  const auto &k = in.key;
  TORCH_CHECK(k.dim() == 4, op, ": expected key [B, H, T, dk], got ", k.sizes());
  const int64_t b = k.size(0), h = k.size(1), t = k.size(2);
  TORCH_CHECK(in.query.sizes() == k.sizes(), op, ": expected query ", k.sizes(), ", got ", in.query.sizes());
  TORCH_CHECK(in.value.dim() == 4 && in.value.size(0) == b && in.value.size(1) == h && in.value.size(2) == t,
              op, ": expected value [", b, ", ", h, ", ", t, ", dv], got ", in.value.sizes());
  TORCH_CHECK(in.beta.sizes() == torch::IntArrayRef({b, h, t}), op, ": expected beta [", b, ", ", h, ", ", t,
              "], got ", in.beta.sizes());
  const bool perChannel = in.decay.dim() == 4;
  TORCH_CHECK((!perChannel && in.decay.sizes() == in.beta.sizes()) ||
                  (perChannel && in.decay.sizes() == k.sizes()),
              op, ": expected decay [B, H, T] or [B, H, T, dk], got ", in.decay.sizes());
}

/// \p in checked, in fp32 and contiguous, the query scaled by 1/sqrt(dk).
Fp32Inputs prepare(const DeltaRuleInputs &in, const char *op) {
  checkShapes(in, op);
  const int64_t dk = in.key.size(3);
  const bool perChannel = in.decay.dim() == 4;
  Fp32Inputs f;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  // fp32 and contiguous in one pass each (the layers hand over [B, T, H, d]
  // tensors transposed to heads first), so chunking them is a view.
  auto fp32 = [](const torch::Tensor &x) {
    return x.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
  };
  f.q = fp32(in.query) * scale;
  f.k = fp32(in.key);
  f.v = fp32(in.value);
  f.beta = fp32(in.beta);
  f.g = perChannel ? fp32(in.decay) : fp32(in.decay).unsqueeze(-1);
  return f;
}

} // namespace

torch::Tensor gatedDeltaRuleRecurrent(const DeltaRuleInputs &in, torch::Tensor *finalState) {
  Fp32Inputs f = prepare(in, "gatedDeltaRuleRecurrent");
  const int64_t b = f.k.size(0), h = f.k.size(1), t = f.k.size(2), dk = f.k.size(3), dv = f.v.size(3);
  torch::Tensor state = torch::zeros({b, h, dk, dv}, f.v.options());
  std::vector<torch::Tensor> outs;
  outs.reserve(t);
  for (int64_t i = 0; i < t; ++i) {
    torch::Tensor qi = f.q.select(2, i), ki = f.k.select(2, i), vi = f.v.select(2, i);
    // Decay the state rows (key channels), then write the corrected value.
    state = state * f.g.select(2, i).exp().unsqueeze(-1);
    torch::Tensor predicted = (state * ki.unsqueeze(-1)).sum(-2);
    torch::Tensor delta = (vi - predicted) * f.beta.select(2, i).unsqueeze(-1);
    state = state + ki.unsqueeze(-1) * delta.unsqueeze(-2);
    outs.push_back((state * qi.unsqueeze(-1)).sum(-2));
  }
  if (finalState)
    *finalState = state;
  return torch::stack(outs, 2).to(in.query.scalar_type());
}

namespace {

/// The chunked form of \p in (named \p op in errors) from \p initialState
/// (undefined: zeros), in the query's dtype. With reduced-precision
/// activations (bf16/fp16 values: the result is rounded to that
/// dtype's 2^-8 anyway) its fp32 GEMMs run on TF32 tensor cores (inputs
/// rounded to 2^-11, fp32 accumulation, as flash-linear-attention's kernels
/// use bf16 tensor cores); fp32 activations keep IEEE fp32.
torch::Tensor chunkedRun(const DeltaRuleInputs &in, const char *op, int64_t chunkSize,
                         const torch::Tensor &initialState, torch::Tensor *finalState) {
  checkShapes(in, op);
  // The CPU takes the same nodes (the flag only affects CUDA GEMMs there), so
  // the op stage's bf16 checks cover their forward and backward everywhere.
  const bool tensorCores = reducedFloat(in.value);
  std::vector<torch::Tensor> r;
  if (in.decay.dim() == 3) { // one decay per head: the kernels, or the node with its backward written out
    r = scalarDecayDeltaRule(in, chunkSize, initialState, tensorCores);
  } else {
#ifdef ADAPT_WITH_CUDA_KERNELS
    if (!deltaRuleNeedsGraph(in, initialState) &&
        chooseKernel("kimi_delta_rule.no_grad", in.key, cuda::kimiDeltaKernelEnabled(),
                     cuda::kimiDeltaRuleForwardTakes(in.query, in.key, in.value, in.decay, in.beta, chunkSize))) {
      torch::Tensor last;
      torch::Tensor out = cuda::kimiDeltaRuleForward(in.query, in.key, in.value, in.decay, in.beta, initialState, &last);
      if (finalState)
        *finalState = last;
      return out;
    }
#endif
    // The node with its backward written out (runtime/KimiDeltaFunction.h);
    // without a graph, its forward alone.
    r = perChannelDecayDeltaRule(in, chunkSize, initialState, tensorCores);
  }
  if (finalState)
    *finalState = r[1];
  return r[0];
}

} // namespace

int64_t deltaRuleSegmentLength(int64_t segmentTokens, int64_t chunkSize) {
  // Whole chunks, so the chunk boundaries match the plain form's.
  return std::max<int64_t>(1, segmentTokens / chunkSize) * chunkSize;
}

torch::Tensor gatedDeltaRuleChunked(const DeltaRuleInputs &in, int64_t chunkSize, torch::Tensor *finalState) {
  TORCH_CHECK(chunkSize > 0, "gatedDeltaRuleChunked: expected a positive chunk size, got ", chunkSize);
  return chunkedRun(in, "gatedDeltaRuleChunked", chunkSize, torch::Tensor(), finalState);
}

torch::Tensor gatedDeltaRuleSegmented(const DeltaRuleInputs &in, int64_t chunkSize, int64_t segmentTokens) {
  return gatedDeltaRuleSegmented(in, chunkSize, segmentTokens, torch::Tensor(), nullptr);
}

torch::Tensor gatedDeltaRuleSegmented(const DeltaRuleInputs &in, int64_t chunkSize, int64_t segmentTokens,
                                      const torch::Tensor &initialState, torch::Tensor *finalState) {
  TORCH_CHECK(chunkSize > 0, "gatedDeltaRuleSegmented: expected a positive chunk size, got ", chunkSize);
  const int64_t t = in.key.dim() == 4 ? in.key.size(2) : 0;
  if (segmentTokens <= 0 || segmentTokens >= t || !torch::GradMode::is_enabled())
    return chunkedRun(in, "gatedDeltaRuleSegmented", chunkSize, initialState, finalState);
  checkShapes(in, "gatedDeltaRuleSegmented");
  const int64_t segment = deltaRuleSegmentLength(segmentTokens, chunkSize);
  // split, not narrow: one backward node stacks every segment's gradient.
  const std::vector<torch::Tensor> q = in.query.split(segment, 2), k = in.key.split(segment, 2),
                                   v = in.value.split(segment, 2), g = in.decay.split(segment, 2),
                                   beta = in.beta.split(segment, 2);
  const int64_t b = in.key.size(0), h = in.key.size(1), dk = in.key.size(3), dv = in.value.size(3);
  torch::Tensor state = initialState.defined() ? initialState
                                              : torch::zeros({b, h, dk, dv}, in.value.options().dtype(torch::kFloat32));
  RecomputedFunctions segmentFn = [chunkSize](const std::vector<torch::Tensor> &x) {
    DeltaRuleInputs part{x[0], x[1], x[2], x[3], x[4]};
    torch::Tensor leaving;
    torch::Tensor out = chunkedRun(part, "gatedDeltaRuleSegmented", chunkSize, x[5], &leaving);
    return std::vector<torch::Tensor>{out, leaving};
  };
  std::vector<torch::Tensor> outs;
  for (size_t s = 0; s < q.size(); ++s) {
    std::vector<torch::Tensor> r = recompute(segmentFn, {q[s], k[s], v[s], g[s], beta[s], state});
    outs.push_back(r[0]);
    state = r[1];
  }
  if (finalState)
    *finalState = state;
  return torch::cat(outs, 2);
}

} // namespace adapt::rt
