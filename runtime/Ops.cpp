//===- Ops.cpp - the operator library's stateless kernels -----------------===//

#include "runtime/Ops.h"

#include "runtime/Errors.h"
#include "runtime/GeneratedOps.h"
#include "runtime/KernelLedger.h"
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/GroupKernel.h"
#include "runtime/cuda/RmsNormKernel.h"
#include "runtime/cuda/RopeKernel.h"
#include "runtime/cuda/RouteKernel.h"
#include "runtime/cuda/SwiGluKernel.h"
#include "runtime/cuda/Switches.h"
#endif

#include <ATen/record_function.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace adapt::rt {

namespace {

#ifdef ADAPT_WITH_CUDA_KERNELS
/// A trained norm weight's gradient (not LoRA's case, whose norms are
/// frozen): the sum over rows of dy * x * rstd, in fp32, as \p type.
torch::Tensor normWeightGradient(const torch::Tensor &gradY, const torch::Tensor &x, const torch::Tensor &rstd,
                                 torch::ScalarType type) {
  const int64_t width = x.size(-1);
  return (gradY.reshape({-1, width}).to(torch::kFloat32) * x.reshape({-1, width}).to(torch::kFloat32) *
          rstd.unsqueeze(1))
      .sum(0)
      .to(type);
}

/// RMSNorm by one CUDA kernel each way (runtime/cuda/RmsNormKernel.h);
/// saves the input and the rows' fp32 rstd. An autograd Function's tensor
/// inputs must be defined, so "no weight" comes as an empty tensor.
struct FusedRmsNorm : torch::autograd::Function<FusedRmsNorm> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &weightOrEmpty, double eps, double offset) {
    const torch::Tensor weight = weightOrEmpty.numel() > 0 ? weightOrEmpty : torch::Tensor();
    auto [y, rstd] = cuda::rmsNormForward(x, weight, eps, offset);
    ctx->save_for_backward({x, weightOrEmpty, rstd});
    ctx->saved_data["offset"] = offset;
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &rstd = saved[2];
    const torch::Tensor weight = saved[1].defined() && saved[1].numel() > 0 ? saved[1] : torch::Tensor();
    torch::Tensor gradX = cuda::rmsNormBackward(x, weight, rstd, grads[0], ctx->saved_data["offset"].toDouble());
    torch::Tensor gradWeight =
        ctx->needs_input_grad(1) ? normWeightGradient(grads[0], x, rstd, weight.scalar_type()) : torch::Tensor();
    return {gradX, gradWeight, torch::Tensor(), torch::Tensor()};
  }
};

/// Whether the decoder's residual stream takes the residual norm kernels: on
/// since the `norm.residual_rms` checks and memcheck passed on an H100
/// (session 44); ADAPT_RESIDUAL_NORM_KERNEL=0 opts out.
bool residualNormKernelOn() {
  static const bool on = !cuda::switchedOff("ADAPT_RESIDUAL_NORM_KERNEL");
  return on;
}

/// residualRmsNorm by the kernels: outputs {h, y}. With a branch, h is new
/// (the add's result); without one, h is the residual returned as is (a view
/// autograd gives this node), so the stream's gradient of h still arrives
/// here. The backward's one kernel sums that gradient into the norm's input
/// gradient, which goes to the residual and, with a branch, to the branch.
struct ResidualRmsNorm : torch::autograd::Function<ResidualRmsNorm> {
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &residual,
                                              const torch::Tensor &branch, const torch::Tensor &weightOrEmpty,
                                              bool hasBranch, double eps, double offset) {
    const torch::Tensor weight = weightOrEmpty.numel() > 0 ? weightOrEmpty : torch::Tensor();
    torch::Tensor h, y, rstd;
    if (hasBranch) {
      std::tie(h, y, rstd) = cuda::residualRmsNormForward(residual, branch, weight, eps, offset);
    } else {
      h = residual;
      std::tie(y, rstd) = cuda::rmsNormForward(residual, weight, eps, offset);
    }
    ctx->save_for_backward({h, weightOrEmpty, rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["hasBranch"] = hasBranch;
    ctx->set_materialize_grads(false);
    return {h, y};
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &h = saved[0], &rstd = saved[2];
    const torch::Tensor weight = saved[1].numel() > 0 ? saved[1] : torch::Tensor();
    const torch::Tensor &gradStream = grads[0], &gradY = grads[1];
    torch::Tensor gradH;
    if (gradY.defined())
      gradH = cuda::rmsNormBackward(h, weight, rstd, gradY, ctx->saved_data["offset"].toDouble(), gradStream);
    else if (gradStream.defined())
      gradH = gradStream;
    torch::Tensor gradWeight = ctx->needs_input_grad(2) && gradY.defined()
                                   ? normWeightGradient(gradY, h, rstd, weight.scalar_type())
                                   : torch::Tensor();
    const bool hasBranch = ctx->saved_data["hasBranch"].toBool();
    return {gradH, hasBranch ? gradH : torch::Tensor(), gradWeight, torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};
#endif

} // namespace

std::pair<torch::Tensor, torch::Tensor> residualRmsNorm(const torch::Tensor &residual, const torch::Tensor &branch,
                                                        const torch::Tensor &weight, double eps, bool zeroCentred) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  // rmsNorm's kernel rule: a weight of another dtype keeps the reference's
  // two roundings unless the norm is zero-centred.
  const bool weightFits = zeroCentred || !weight.defined() || weight.scalar_type() == residual.scalar_type();
  const bool branchFits = !branch.defined() || (branch.sizes() == residual.sizes() &&
                                                branch.scalar_type() == residual.scalar_type() &&
                                                branch.device() == residual.device());
  if (residual.is_cuda() &&
      chooseKernel("residual_rms_norm", residual, residualNormKernelOn(),
                   weightFits && branchFits && cuda::rmsNormKernelFits(residual, weight))) {
    auto out = ResidualRmsNorm::apply(residual, branch.defined() ? branch : torch::empty({0}, residual.options()),
                                      weight.defined() ? weight : torch::empty({0}, residual.options()),
                                      branch.defined(), eps, zeroCentred ? 1.0 : 0.0);
    return {out[0], out[1]};
  }
#endif
  torch::Tensor h = branch.defined() ? residual + branch : residual;
  return {h, zeroCentred ? zeroCentredRmsNorm(h, weight, eps) : rmsNorm(h, weight, eps)};
}

torch::Tensor zeroCentredRmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps) {
  if (torch::Tensor y = rmsNormByKernel(x, weight, eps, 1.0); y.defined())
    return y;
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (h * (1.0 + weight.to(torch::kFloat32))).to(x.scalar_type());
}

torch::Tensor rmsNormByKernel(const torch::Tensor &x, const torch::Tensor &weight, double eps, double offset) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("rms_norm", x, true, cuda::rmsNormKernelFits(x, weight)))
    return FusedRmsNorm::apply(x, weight.defined() ? weight : torch::empty({0}, x.options()), eps, offset);
#endif
  return torch::Tensor();
}

torch::Tensor rmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps) {
  // On the GPU, one kernel each way (fp32 inside, one rounding at the end) in
  // place of five elementwise passes and two casts; LibTorch's fused kernel
  // where ours does not fit. A weight of another dtype keeps the reference's
  // two roundings (and its promotion), below.
  if (x.is_cuda() && (!weight.defined() || weight.scalar_type() == x.scalar_type())) {
    if (torch::Tensor y = rmsNormByKernel(x, weight, eps, 0.0); y.defined())
      return y;
    return at::rms_norm(x, {x.size(-1)}, weight.defined() ? std::optional<torch::Tensor>(weight) : std::nullopt, eps);
  }
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (!weight.defined())
    return h.to(x.scalar_type());
  return weight * h.to(x.scalar_type());
}

namespace {

/// YaRN's mscale: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1).
double yarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

/// Dimension index at which a wavelength completes \p rotations over the
/// original context (YaRN's correction dim).
double yarnCorrectionDim(double rotations, int64_t dim, double base, double maxPos) {
  return (dim * std::log(maxPos / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

} // namespace

double ropeAttentionFactor(const RopeDef &rope) {
  if (rope.scaling != "yarn")
    return 1.0;
  if (rope.mscale != 0.0 && rope.mscaleAllDim != 0.0)
    return yarnMscale(rope.factor, rope.mscale) / yarnMscale(rope.factor, rope.mscaleAllDim);
  return yarnMscale(rope.factor, 1.0);
}

torch::Tensor ropeInverseFrequencies(const RopeDef &rope) {
  const int64_t dim = rope.rotaryDim;
  // base^(2i/dim) in fp32, computed as the reference does.
  torch::Tensor exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / dim;
  torch::Tensor posFreqs = torch::pow(rope.theta, exponents);
  torch::Tensor inv = 1.0 / posFreqs;
  if (rope.scaling == "yarn") {
    double maxPos = static_cast<double>(rope.originalMaxPositions);
    double low = yarnCorrectionDim(rope.betaFast, dim, rope.theta, maxPos);
    double high = yarnCorrectionDim(rope.betaSlow, dim, rope.theta, maxPos);
    if (rope.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high)
      high += 0.001;
    torch::Tensor ramp = ((torch::arange(dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
    torch::Tensor extrapolationFactor = 1 - ramp;
    torch::Tensor interpolation = 1.0 / (rope.factor * posFreqs);
    inv = interpolation * (1 - extrapolationFactor) + inv * extrapolationFactor;
  } else if (rope.scaling == "llama3") {
    double oldContext = static_cast<double>(rope.originalMaxPositions);
    double lowWavelen = oldContext / rope.lowFreqFactor;
    double highWavelen = oldContext / rope.highFreqFactor;
    torch::Tensor wavelen = 2 * M_PI / inv;
    torch::Tensor scaled = torch::where(wavelen > lowWavelen, inv / rope.factor, inv);
    torch::Tensor smooth = (oldContext / wavelen - rope.lowFreqFactor) /
                           (rope.highFreqFactor - rope.lowFreqFactor);
    torch::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
    torch::Tensor medium = (wavelen >= highWavelen).logical_and(wavelen <= lowWavelen);
    inv = torch::where(medium, smoothed, scaled);
  }
  return inv;
}

RopeTables ropeTables(const RopeDef &rope, int64_t seqLen, torch::Device device) {
  torch::Tensor inv = ropeInverseFrequencies(rope).to(device);
  torch::Tensor pos = torch::arange(seqLen, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  torch::Tensor freqs = torch::outer(pos, inv); // [T, dim/2]
  torch::Tensor emb = rope.interleaved ? freqs.repeat_interleave(2, -1) : torch::cat({freqs, freqs}, -1);
  double factor = ropeAttentionFactor(rope);
  return {emb.cos() * factor, emb.sin() * factor};
}

RopeTables ropeTablesAt(const RopeDef &rope, int64_t first, int64_t count, torch::Device device) {
  RopeTables t = ropeTables(rope, first + count, device);
  if (first > 0) // The same rows as the whole sequence's table.
    t = {t.cos.narrow(0, first, count), t.sin.narrow(0, first, count)};
  return t;
}

namespace {

#ifdef ADAPT_WITH_CUDA_KERNELS
/// applyRope by one CUDA kernel each way (runtime/cuda/RopeKernel.h); keeps
/// only the tables for backward, whose kernel applies the transposed rotation.
struct FusedRope : torch::autograd::Function<FusedRope> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &cos, const torch::Tensor &sin, bool interleaved) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["interleaved"] = interleaved;
    return cuda::rotary(x, cos, sin, interleaved, /*adjoint=*/false);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor g = grads[0].stride(-1) == 1 ? grads[0] : grads[0].contiguous();
    return {cuda::rotary(g, saved[0], saved[1], ctx->saved_data["interleaved"].toBool(), /*adjoint=*/true),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

/// Whether the rotary kernel takes \p x with tables \p t: CUDA, [B, H, T, D]
/// with a unit last stride, plain fp32 [T, rot] tables without a gradient.
bool rotaryKernelFits(const torch::Tensor &x, const RopeTables &t) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  const auto fp32Table = [&](const torch::Tensor &table) {
    return table.dim() == 2 && table.scalar_type() == torch::kFloat32 && table.stride(1) == 1 &&
           !table.requires_grad() && table.size(0) == x.size(2) && table.size(1) % 2 == 0 &&
           table.size(1) <= x.size(3);
  };
  return x.is_cuda() && x.dim() == 4 && x.stride(3) == 1 && fp32Table(t.cos) && fp32Table(t.sin) &&
         t.cos.sizes() == t.sin.sizes() && t.cos.stride(0) == t.sin.stride(0);
#else
  (void)x, (void)t;
  return false;
#endif
}

} // namespace

torch::Tensor applyRope(const torch::Tensor &x, const RopeTables &t, bool interleaved) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("rope", x, true, rotaryKernelFits(x, t)))
    return FusedRope::apply(x, t.cos, t.sin, interleaved);
#endif
  const int64_t rot = t.cos.size(-1);
  torch::Tensor xr = x.narrow(-1, 0, rot);
  torch::Tensor rotated;
  if (interleaved) {
    // (x0, x1) -> (-x1, x0) for each pair.
    torch::Tensor pairs = xr.unflatten(-1, {rot / 2, 2});
    rotated = torch::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  } else {
    rotated = torch::cat({-xr.narrow(-1, rot / 2, rot / 2), xr.narrow(-1, 0, rot / 2)}, -1);
  }
  torch::Tensor cos = t.cos.to(x.scalar_type()), sin = t.sin.to(x.scalar_type());
  torch::Tensor out = xr * cos + rotated * sin;
  if (rot == x.size(-1))
    return out;
  return torch::cat({out, x.narrow(-1, rot, x.size(-1) - rot)}, -1);
}

namespace {

/// [T, S] boolean: true where query i (at position offset + i) may attend to key j.
torch::Tensor visibility(int64_t queries, int64_t keys, const AttentionMask &mask, torch::Device device) {
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device);
  torch::Tensor i = (torch::arange(queries, opts) + mask.queryOffset).unsqueeze(1);
  torch::Tensor j = torch::arange(keys, opts).unsqueeze(0);
  torch::Tensor ok = j <= i;
  if (mask.slidingWindow > 0)
    ok = ok.logical_and((i - j) < mask.slidingWindow);
  if (mask.chunkSize > 0)
    ok = ok.logical_and(torch::div(i, mask.chunkSize, "floor") == torch::div(j, mask.chunkSize, "floor"));
  return ok;
}

} // namespace

torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k,
                        const torch::Tensor &v, double scale,
                        const AttentionMask &mask, const torch::Tensor &sinks) {
  const int64_t seqLen = q.size(2), keys = k.size(2);
  const bool plainCausal = mask.slidingWindow <= 0 && mask.chunkSize <= 0 && mask.queryOffset == 0 && keys == seqLen;
  if (!sinks.defined()) {
    std::optional<torch::Tensor> bias;
    if (!plainCausal)
      bias = visibility(seqLen, keys, mask, q.device());
    return at::scaled_dot_product_attention(q, k, v, bias, 0.0, /*is_causal=*/plainCausal,
                                            scale, /*enable_gqa=*/true);
  }
  // Sinks: an extra logit per head that takes probability mass and no value.
  const int64_t groups = q.size(1) / k.size(1);
  torch::Tensor kk = groups > 1 ? k.repeat_interleave(groups, 1) : k;
  torch::Tensor vv = groups > 1 ? v.repeat_interleave(groups, 1) : v;
  torch::Tensor scores = torch::matmul(q, kk.transpose(-2, -1)).to(torch::kFloat32) * scale;
  scores = scores.masked_fill(visibility(seqLen, keys, mask, q.device()).logical_not(),
                              -std::numeric_limits<float>::infinity());
  torch::Tensor sinkCol = sinks.to(torch::kFloat32).view({1, -1, 1, 1}).expand({q.size(0), -1, seqLen, 1});
  torch::Tensor all = torch::cat({scores, sinkCol}, -1);
  all = all - std::get<0>(all.max(-1, true)).detach();
  torch::Tensor probs = torch::softmax(all, -1).narrow(-1, 0, keys);
  return torch::matmul(probs.to(v.scalar_type()), vv);
}

namespace {
/// Calls the generated operator for \p component and checks the shape of what
/// it returns (a RuntimeError naming the component otherwise).
torch::Tensor callGenerated(const std::string &component, const std::vector<torch::Tensor> &inputs,
                            const std::map<std::string, double> &params,
                            c10::IntArrayRef expected) {
  // The op stage validated the candidate in fp32: it runs in fp32 here too
  // (bf16 activations are widened, the result narrowed back).
  std::vector<torch::Tensor> widened;
  c10::optional<torch::ScalarType> outType;
  for (const torch::Tensor &t : inputs) {
    if (t.is_floating_point() && !outType)
      outType = t.scalar_type();
    widened.push_back(t.is_floating_point() ? t.to(torch::kFloat32) : t);
  }
  torch::Tensor out = generatedOp(component).fn(widened, params);
  if (out.defined() && outType && out.is_floating_point())
    out = out.to(*outType);
  if (!out.defined() || out.sizes() != expected)
    throw RuntimeError("", component,
                       "the generated operator returned " +
                           (out.defined() ? c10::str(out.sizes()) : std::string("nothing")) +
                           ", expected " + c10::str(expected));
  return out;
}

/// Routing by an approved generated operator: it returns dense [N, E] combine
/// weights (zero off the chosen experts) from the logits and the correction
/// bias, with the parameters the op stage checked it with.
Routing routeGenerated(const torch::Tensor &logits, const FfnDef &ffn, const torch::Tensor &bias) {
  const bool sigmoid = ffn.router == RouterKind::SigmoidTopK;
  std::map<std::string, double> params = {
      {"top_k", double(ffn.topK)},
      {"n_group", double(ffn.groups)},
      {"topk_group", double(ffn.topKGroups)},
      {"norm_topk_prob", ffn.normTopK ? 1.0 : 0.0},
      {"routed_scaling_factor", ffn.routedScaling},
      {"use_bias", bias.defined() ? 1.0 : 0.0},
      {"scoring", sigmoid ? 1.0 : 0.0}};
  torch::Tensor b = bias.defined() ? bias.to(torch::kFloat32)
                                   : torch::zeros({logits.size(1)}, logits.options());
  torch::Tensor dense = callGenerated(ffn.generatedRouter, {logits, b}, params, logits.sizes());
  auto [w, idx] = dense.topk(ffn.topK, -1);
  return {idx, w};
}
} // namespace

torch::Tensor generatedRope(const std::string &component, const torch::Tensor &x,
                            const RopeTables &tables, const RopeDef &rope) {
  const bool mrope = !rope.mropeSection.empty();
  const int64_t seqLen = x.size(2);
  const int scaling = rope.scaling == "yarn" ? 1 : rope.scaling == "llama3" ? 2 : 0;
  std::map<std::string, double> params = {
      {"theta", rope.theta},
      {"rotary_dim", double(rope.rotaryDim)},
      {"scaling", double(scaling)},
      {"interleaved", rope.interleaved ? 1.0 : 0.0},
      {"mrope", mrope ? 1.0 : 0.0},
      {"factor", rope.factor},
      {"original_max_position_embeddings", double(rope.originalMaxPositions)},
      {"beta_fast", rope.betaFast},
      {"beta_slow", rope.betaSlow},
      {"mscale", rope.mscale},
      {"mscale_all_dim", rope.mscaleAllDim},
      {"truncate", rope.truncate ? 1.0 : 0.0},
      {"attention_factor", ropeAttentionFactor(rope)},
      {"low_freq_factor", rope.lowFreqFactor},
      {"high_freq_factor", rope.highFreqFactor}};
  if (mrope) {
    const char *axes[] = {"mrope_section_t", "mrope_section_h", "mrope_section_w"};
    for (size_t a = 0; a < 3 && a < rope.mropeSection.size(); ++a)
      params[axes[a]] = double(rope.mropeSection[a]);
  }
  torch::Tensor text = torch::arange(seqLen, x.options().dtype(torch::kLong))
                           .unsqueeze(0)
                           .expand({mrope ? 3 : 1, seqLen});
  std::vector<torch::Tensor> outputs;
  for (int64_t b = 0; b < x.size(0); ++b) {
    torch::Tensor positions = tables.positions.defined() && mrope
                                  ? tables.positions.select(1, b).to(x.device(), torch::kLong)
                                  : text;
    torch::Tensor xb = x[b].transpose(0, 1); // [T, H, D]
    outputs.push_back(callGenerated(component, {xb, positions}, params, xb.sizes()).transpose(0, 1));
  }
  return torch::stack(outputs);
}

torch::Tensor generatedAttention(const std::string &component, const torch::Tensor &q,
                                 const torch::Tensor &k, const torch::Tensor &v, double scale,
                                 const AttentionMask &mask, const torch::Tensor &sinks) {
  if (mask.chunkSize > 0)
    throw RuntimeError("", component,
                       "the attention_core task has no chunked mask; a generated core cannot "
                       "run Llama-4's chunked layers");
  const std::map<std::string, double> params = {{"window", double(mask.slidingWindow)},
                                                {"use_sinks", sinks.defined() ? 1.0 : 0.0},
                                                {"scale", scale}};
  torch::Tensor noSinks = torch::zeros({q.size(1)}, q.options().dtype(torch::kFloat32));
  std::vector<torch::Tensor> outputs;
  // The task's layout is one sequence [T, heads, D]; the runtime's [B, H, T, D].
  for (int64_t b = 0; b < q.size(0); ++b) {
    torch::Tensor qb = q[b].transpose(0, 1), kb = k[b].transpose(0, 1), vb = v[b].transpose(0, 1);
    std::vector<int64_t> expected = {qb.size(0), qb.size(1), vb.size(2)};
    outputs.push_back(callGenerated(component,
                                    {qb, kb, vb, sinks.defined() ? sinks : noSinks}, params,
                                    expected)
                          .transpose(0, 1));
  }
  return torch::stack(outputs);
}

namespace {
/// The experts a built-in router picks for each token: [N, k] int64.
torch::Tensor chooseExperts(const torch::Tensor &l, const FfnDef &ffn, const torch::Tensor &bias) {
  const int64_t k = ffn.topK;
  switch (ffn.router) {
  case RouterKind::SoftmaxTopK:
    return std::get<1>(torch::softmax(l, -1).topk(k, -1));
  case RouterKind::SigmoidTopK: {
    torch::Tensor choice = torch::sigmoid(l);
    if (bias.defined())
      choice = choice + bias.to(torch::kFloat32);
    if (ffn.groups > 1) {
      const int64_t n = l.size(0), perGroup = l.size(1) / ffn.groups;
      torch::Tensor grouped = choice.view({n, ffn.groups, perGroup});
      torch::Tensor groupScores = std::get<0>(grouped.topk(2, -1)).sum(-1);
      torch::Tensor keep = std::get<1>(groupScores.topk(ffn.topKGroups, -1));
      torch::Tensor groupMask = torch::zeros_like(groupScores).scatter_(1, keep, 1.0);
      torch::Tensor expertMask = groupMask.unsqueeze(-1).expand({n, ffn.groups, perGroup}).reshape({n, -1});
      choice = choice.masked_fill(expertMask.logical_not(), 0.0);
    }
    return std::get<1>(choice.topk(k, -1));
  }
  case RouterKind::TopKSoftmax:
  case RouterKind::TopKSigmoidInput:
    return std::get<1>(l.topk(k, -1));
  }
  throw std::logic_error("unknown router kind");
}

/// The combine weights of experts \p idx: the router's scores at \p idx,
/// normalised and scaled per router kind (gathering the values topk
/// returned, so route() is unchanged to the bit, gradients included).
torch::Tensor weighExperts(const torch::Tensor &l, const FfnDef &ffn, const torch::Tensor &idx) {
  switch (ffn.router) {
  case RouterKind::SoftmaxTopK: {
    torch::Tensor w = torch::softmax(l, -1).gather(1, idx);
    if (ffn.normTopK)
      w = w / w.sum(-1, true);
    return w * ffn.routedScaling;
  }
  case RouterKind::SigmoidTopK: {
    torch::Tensor w = torch::sigmoid(l).gather(1, idx);
    if (ffn.normTopK)
      w = w / (w.sum(-1, true) + 1e-20);
    return w * ffn.routedScaling;
  }
  case RouterKind::TopKSoftmax:
    return torch::softmax(l.gather(1, idx), -1);
  case RouterKind::TopKSigmoidInput:
    return torch::sigmoid(l.gather(1, idx));
  }
  throw std::logic_error("unknown router kind");
}
} // namespace

#ifdef ADAPT_WITH_CUDA_KERNELS
namespace {
/// route() for the routers that score every expert, by one CUDA kernel each
/// way (runtime/cuda/RouteKernel.h): the experts are an output without a
/// gradient, the weights' gradient comes back to the logits.
struct FusedRoute : torch::autograd::Function<FusedRoute> {
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &logits,
                                              const torch::Tensor &biasOrEmpty, bool sigmoid, int64_t k,
                                              int64_t groups, int64_t topKGroups, bool norm, double scaling) {
    const cuda::RouteSpec spec{sigmoid, k, groups, topKGroups, norm, scaling};
    auto [experts, weights] =
        cuda::routeForward(logits, biasOrEmpty.numel() > 0 ? biasOrEmpty : torch::Tensor(), spec);
    ctx->save_for_backward({logits, experts});
    ctx->mark_non_differentiable({experts});
    ctx->saved_data["sigmoid"] = sigmoid;
    ctx->saved_data["k"] = k;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["topKGroups"] = topKGroups;
    ctx->saved_data["norm"] = norm;
    ctx->saved_data["scaling"] = scaling;
    return {experts, weights};
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &d = ctx->saved_data;
    const cuda::RouteSpec spec{d.at("sigmoid").toBool(), d.at("k").toInt(), d.at("groups").toInt(),
                               d.at("topKGroups").toInt(), d.at("norm").toBool(), d.at("scaling").toDouble()};
    torch::Tensor gradWeights = grads[1].defined() ? grads[1] : torch::zeros_like(saved[1], torch::kFloat32);
    return {cuda::routeBackward(saved[0], saved[1], gradWeights, spec), {}, {}, {}, {}, {}, {}, {}};
  }
};

/// The kernel's form of \p ffn's router, where it has one.
std::optional<cuda::RouteSpec> kernelRoute(const torch::Tensor &l, const FfnDef &ffn) {
  if (ffn.router != RouterKind::SoftmaxTopK && ffn.router != RouterKind::SigmoidTopK)
    return std::nullopt;
  const bool sigmoid = ffn.router == RouterKind::SigmoidTopK;
  // The composition limits groups for sigmoid scores only (chooseExperts).
  const bool grouped = sigmoid && ffn.groups > 1;
  cuda::RouteSpec spec{sigmoid, ffn.topK, grouped ? ffn.groups : 1, grouped ? ffn.topKGroups : 1, ffn.normTopK,
                       ffn.routedScaling};
  if (!cuda::routeKernelFits(l, spec))
    return std::nullopt;
  return spec;
}
} // namespace
#endif

Routing route(const torch::Tensor &logits, const FfnDef &ffn, const torch::Tensor &bias) {
  RECORD_FUNCTION("adapt::moe.route", c10::ArrayRef<const c10::IValue>{}); // a --profile scope
  torch::Tensor l = logits.to(torch::kFloat32);
  if (!ffn.generatedRouter.empty())
    return routeGenerated(l, ffn, bias);
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (std::optional<cuda::RouteSpec> spec = kernelRoute(l, ffn); chooseKernel("moe.route", l, true, spec.has_value())) {
    // The composition's softmax router ignores a correction bias (chooseExperts); so does this.
    const bool biased = bias.defined() && spec->sigmoid;
    auto out = FusedRoute::apply(l, biased ? bias : torch::empty({0}, l.options()), spec->sigmoid,
                                 spec->topK, spec->groups, spec->topKGroups, spec->normTopK, spec->scaling);
    return {out[0], out[1]};
  }
#endif
  torch::Tensor idx = chooseExperts(l, ffn, bias);
  return {idx, weighExperts(l, ffn, idx)};
}

Routing routeForced(const torch::Tensor &logits, const FfnDef &ffn, const torch::Tensor &bias,
                    const torch::Tensor &experts) {
  if (!ffn.generatedRouter.empty())
    throw badInput("", "--force-routing", "forced routing needs a built-in router, not the generated " +
                                              ffn.generatedRouter);
  const int64_t n = logits.size(0);
  if (experts.dim() != 2 || experts.size(0) != n || experts.size(1) != ffn.topK)
    throw badInput("", "--force-routing",
                   "expected experts of shape [" + std::to_string(n) + ", " + std::to_string(ffn.topK) +
                       "], got " + c10::str(experts.sizes()));
  torch::Tensor idx = experts.to(logits.device(), torch::kLong);
  return {idx, weighExperts(logits.to(torch::kFloat32), ffn, idx)};
}

void checkForcedExperts(const torch::Tensor &experts, int64_t count, const std::string &block) {
  if (experts.numel() > 0 && (experts.min().item<int64_t>() < 0 || experts.max().item<int64_t>() >= count))
    throw badInput("", "--force-routing",
                   "expected expert ids in [0, " + std::to_string(count) + ") for " + block);
}

torch::Tensor routingDifferences(const Routing &a, const Routing &b) {
  torch::Tensor x = std::get<0>(a.experts.sort(-1)), y = std::get<0>(b.experts.to(x.device()).sort(-1));
  return (x != y).any(-1).sum();
}

ExpertGroups groupByExpert(const Routing &routing, int64_t experts, int64_t align) {
  RECORD_FUNCTION("adapt::moe.permute", c10::ArrayRef<const c10::IValue>{}); // a --profile scope
  const int64_t k = routing.experts.size(1);
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("moe.group", routing.experts, true, cuda::groupKernelFits(routing.experts, experts))) {
    // a stable counting sort
    cuda::GroupedPairs p = cuda::groupPairs(routing.experts, routing.weights, experts, align);
    ExpertGroups g{p.tokenOfRow, p.weightOfRow, p.expertOfRow, p.offsets, p.rowCounts, p.counts, p.rowOfPair, k};
    if (routing.weights.requires_grad()) // the rows' weights keep their gradient (Llama-4 scales inputs by them)
      g.weightOfRow = torch::zeros_like(p.weightOfRow).index_copy(0, p.rowOfPair, routing.weights.reshape({-1}));
    return g;
  }
#endif
  torch::Tensor flat = routing.experts.reshape({-1});
  torch::Tensor order = std::get<1>(flat.sort(/*stable=*/true, 0, false));
  ExpertGroups g;
  torch::Tensor expertOfRow = flat.index_select(0, order);
  torch::Tensor tokenOfRow = torch::div(order, k, "floor");
  torch::Tensor weightOfRow = routing.weights.reshape({-1}).index_select(0, order);
  // Counted by a scatter, not bincount: bincount reads the largest id back
  // to the host, a synchronisation per MoE layer on the GPU.
  g.counts = torch::zeros({experts}, flat.options()).scatter_add_(0, flat, torch::ones_like(flat));
  g.pairsPerToken = k;
  if (align <= 1) {
    g.rowOfPair = torch::empty_like(order).index_copy_(0, order, torch::arange(flat.size(0), flat.options()));
    g.expertOfRow = expertOfRow;
    g.tokenOfRow = tokenOfRow;
    g.weightOfRow = weightOfRow;
    g.rowCounts = g.counts;
    g.offsets = g.counts.cumsum(0).to(torch::kInt32);
    return g;
  }
  // Row r of expert e moves from start[e] + j to paddedStart[e] + j.
  g.rowCounts = torch::div(g.counts + (align - 1), align, "floor") * align;
  torch::Tensor paddedEnd = g.rowCounts.cumsum(0);
  torch::Tensor start = g.counts.cumsum(0) - g.counts, paddedStart = paddedEnd - g.rowCounts;
  torch::Tensor rows = torch::arange(flat.size(0), flat.options());
  torch::Tensor dest = rows - start.index_select(0, expertOfRow) + paddedStart.index_select(0, expertOfRow);
  // A size known without synchronising: an upper bound. The last group runs
  // to it, so every row the GEMMs touch holds a real (finite) token.
  const int64_t bound = flat.size(0) + experts * (align - 1);
  paddedEnd = paddedEnd.clone();
  paddedEnd.narrow(0, experts - 1, 1).fill_(bound); // on the device: no host-to-device copy
  g.rowCounts = paddedEnd - paddedStart;
  g.rowOfPair = torch::empty_like(order).index_copy_(0, order, dest);
  g.tokenOfRow = torch::zeros({bound}, tokenOfRow.options()).index_copy_(0, dest, tokenOfRow);
  g.weightOfRow = torch::zeros({bound}, weightOfRow.options()).index_copy_(0, dest, weightOfRow);
  torch::Tensor allRows = torch::arange(bound, flat.options());
  g.expertOfRow = torch::searchsorted(paddedEnd, allRows, /*out_int32=*/false, /*right=*/true).clamp_max(experts - 1);
  g.offsets = paddedEnd.to(torch::kInt32);
  return g;
}

int64_t groupAlignment(const torch::Device &device) { return device.is_cuda() ? 16 : 1; }

namespace {

#ifdef ADAPT_WITH_CUDA_KERNELS
/// silu(gate) * up over a fused [rows, 2W] projection by one CUDA kernel each
/// way; saves only the projection for backward.
struct FusedSwiGlu : torch::autograd::Function<FusedSwiGlu> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &gateUp) {
    torch::Tensor in = gateUp.contiguous();
    ctx->save_for_backward({in});
    return cuda::swiGluForward(in);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    return {cuda::swiGluBackward(ctx->get_saved_variables()[0], grads[0].contiguous())};
  }
};

torch::Tensor fusedSwiGlu(const torch::Tensor &gateUp) { return FusedSwiGlu::apply(gateUp); }
#endif

} // namespace

bool hasGroupedMm(const torch::Tensor &x, const torch::Tensor &w) {
  const auto type = x.scalar_type();
  const bool kernel = x.device().is_cpu() ? type == torch::kFloat32 || type == torch::kBFloat16
                                          : x.device().is_cuda() && type == torch::kBFloat16;
  const int64_t bytes = x.element_size();
  return kernel && (w.size(1) * bytes) % 16 == 0 && (w.size(2) * bytes) % 16 == 0;
}


torch::Tensor groupedLinear(const torch::Tensor &x, const torch::Tensor &w,
                            const ExpertGroups &groups) {
  // w is [E, N, K]; the grouped GEMM wants [E, K, N]: a transposed view.
  torch::Tensor wt = w.contiguous().transpose(-2, -1);
  if (hasGroupedMm(x, w) && x.size(0) > 0)
    return at::_grouped_mm(x.contiguous(), wt, groups.offsets);
  // Fallback: one matmul per expert over its contiguous row range.
  std::vector<torch::Tensor> parts;
  torch::Tensor counts = groups.rowCounts.cpu();
  int64_t begin = 0;
  for (int64_t e = 0; e < w.size(0); ++e) {
    int64_t n = counts[e].item<int64_t>();
    if (n > 0)
      parts.push_back(torch::matmul(x.narrow(0, begin, n), wt[e]));
    begin += n;
  }
  if (parts.empty())
    return torch::zeros({0, w.size(1)}, x.options());
  return torch::cat(parts, 0);
}

torch::Tensor gatedActivation(const torch::Tensor &gateUp, bool interleaved, const FfnDef &ffn) {
  const int64_t width = gateUp.size(-1) / 2;
  torch::Tensor gate, up;
  if (interleaved) {
    gate = gateUp.slice(-1, 0, 2 * width, 2);
    up = gateUp.slice(-1, 1, 2 * width, 2);
  } else {
    gate = gateUp.narrow(-1, 0, width);
    up = gateUp.narrow(-1, width, width);
  }
  if (!ffn.generatedActivation.empty())
    return callGenerated(ffn.generatedActivation, {gate, up},
                         {{"clamped", ffn.act == ExpertAct::ClampedSwiGLU ? 1.0 : 0.0},
                          {"alpha", ffn.swigluAlpha},
                          {"limit", ffn.swigluLimit}},
                         gate.sizes());
  if (ffn.act == ExpertAct::ClampedSwiGLU) {
    gate = gate.clamp_max(ffn.swigluLimit);
    up = up.clamp(-ffn.swigluLimit, ffn.swigluLimit);
    torch::Tensor glu = gate * torch::sigmoid(gate * ffn.swigluAlpha);
    return (up + 1) * glu;
  }
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (!interleaved && gateUp.is_cuda() && gateUp.dim() == 2)
    return fusedSwiGlu(gateUp);
#endif
  return torch::silu(gate) * up;
}

} // namespace adapt::rt
