//===- Layers.cpp - modules with weights: linear+LoRA, attention, FFN -----===//

#include "runtime/Layers.h"
#include "runtime/ExpertRows.h"
#include "runtime/FusedExperts.h"
#include "runtime/RouterLogits.h"
#include "runtime/SparseAttention.h"

#include "runtime/LinearAttention.h"
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/LowRankKernel.h"
#endif

#include <cmath>

namespace adapt::rt {

namespace {

/// y = x W^T + b + (x A^T)(s B)^T as one autograd node whose rank-r terms
/// accumulate in place: forward into the base output, backward into the
/// base input gradient (addmm_ with beta = 1, one rounding), so neither a
/// separate [tokens, in] LoRA input gradient nor the add that autograd would
/// make of the two exists (profiled at ~0.1 ms per MoE layer on the H200 for
/// q/k/v/o, docs/performance.md, seventh round). The factors come as the
/// fp32 adapters and get their gradients in fp32; the frozen weight and bias
/// get none.
struct LoraLinearFunction : torch::autograd::Function<LoraLinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &loraA, const torch::Tensor &loraB, const torch::Tensor &weight,
                               const torch::Tensor &biasOrEmpty, double scale) {
    const auto dtype = x.scalar_type();
    const torch::Tensor a = loraA.to(dtype), scaledB = (loraB * scale).to(dtype);
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
    torch::Tensor y = torch::linear(x2, weight, biasOrEmpty.numel() > 0 ? biasOrEmpty : torch::Tensor());
    const torch::Tensor down = torch::mm(x2, a.t()); // [tokens, r]
    y.addmm_(down, scaledB.t());
    ctx->save_for_backward({x2, a, scaledB, weight, down});
    ctx->saved_data["scale"] = scale;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return y.view(shape);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const torch::Tensor &x2 = v[0], &a = v[1], &scaledB = v[2], &weight = v[3], &down = v[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const torch::Tensor dy = grads[0].reshape({-1, weight.size(0)});
    const torch::Tensor dDown = torch::mm(dy, scaledB); // [tokens, r]
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) { // not for a first layer's frozen embeddings
      std::vector<int64_t> shape = grads[0].sizes().vec();
      shape.back() = weight.size(1);
      dx = torch::mm(dy, weight).addmm_(dDown, a).view(shape);
    }
    torch::Tensor dA = torch::mm(dDown.t(), x2).to(torch::kFloat32);
    torch::Tensor dB = torch::mm(dy.t(), down).to(torch::kFloat32) * scale;
    return {dx, dA, dB, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor LoraLinear::forward(const torch::Tensor &input, bool training) const {
  // Column-parallel: the whole input, whose gradient the group sums.
  const torch::Tensor x = split == TensorSplit::Columns ? copyToTensorRegion(input, *tensorGroup) : input;
  // Row-parallel: the bias joins once, after the partial outputs are summed.
  const bool rows = split == TensorSplit::Rows;
  const bool dropping = training && dropout > 0.0;
  // One node with in-place accumulation where the LoRA input is the base
  // input and the frozen parts are plain (LoraLinearFunction).
  if (hasLora() && !dropping && split == TensorSplit::None && !weight.requires_grad() &&
      !(bias.defined() && bias.requires_grad()) && x.dim() >= 1 && x.numel() > 0 &&
      loraA.scalar_type() == torch::kFloat32 && loraB.scalar_type() == torch::kFloat32)
    return LoraLinearFunction::apply(x, loraA, loraB, weight, bias.defined() ? bias : torch::empty({0}, x.options()),
                                     scale);
  torch::Tensor y = torch::linear(x, weight, rows ? torch::Tensor() : bias);
  if (hasLora()) {
    torch::Tensor in = x;
    if (dropping)
      in = torch::dropout(in, dropout, /*train=*/true);
    // The scale joins the rank-r factor, not the [tokens, out] product.
    torch::Tensor a = loraA.to(x.scalar_type()), b = (loraB * scale).to(x.scalar_type());
    // The up-projection accumulates into the base output inside the GEMM (beta = 1).
    const std::vector<int64_t> shape = y.sizes().vec();
    torch::Tensor down = torch::linear(in, a);
    y = torch::addmm(y.reshape({-1, shape.back()}), down.reshape({-1, down.size(-1)}), b.t()).view(shape);
  }
  if (!rows)
    return y;
  y = reduceFromTensorRegion(y, *tensorGroup);
  return bias.defined() ? y + bias : y;
}

std::pair<torch::Tensor, torch::Tensor> ExpertLinear::groupedFactors(torch::ScalarType dtype) const {
  const int64_t experts = weight.size(0), rank = loraA.size(0) / experts;
  torch::Tensor a = loraA.to(dtype), b = loraB.to(dtype);
  if (peftSwapped) // A [E*r, out] rows e*r+k, B [in, r*E] columns k*E+e.
    return {b.view({b.size(0), rank, experts}).permute({2, 1, 0}),
            a.view({experts, rank, a.size(1)}).transpose(1, 2)};
  // A [E*r, in] rows e*r+k, B [out, r*E] columns k*E+e.
  return {a.view({experts, rank, a.size(1)}), b.view({b.size(0), rank, experts}).permute({2, 0, 1})};
}

namespace {

#ifdef ADAPT_WITH_CUDA_KERNELS
/// The routed experts' base grouped GEMM and its LoRA as one autograd node:
/// y = x W_e^T + (x A_e^T) (s B_e)^T per expert's rows. The rank-r
/// up-projection is added into the base output in place (forward), and its
/// input-gradient term into the base input gradient (backward), by
/// cuda::addLowRankRows, so neither a [rows, out] LoRA product nor the adds
/// after it exist. The frozen W gets no gradient; A's and B's come from two
/// grouped GEMMs whose groups split the rows (the reduction) dimension.
struct ExpertLoraFunction : torch::autograd::Function<ExpertLoraFunction> {
  /// \p a [E, r, in], \p scaledB [E, out, r] (scale included), \p weight
  /// [E, out, in] frozen; rows of \p x sorted by expert (\p offsets, \p
  /// expertOfRow from ExpertGroups).
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &a, const torch::Tensor &scaledB, const torch::Tensor &weight,
                               const torch::Tensor &offsets, const torch::Tensor &expertOfRow) {
    torch::Tensor in = x.contiguous(), down = a.contiguous(), up = scaledB.contiguous();
    torch::Tensor y = at::_grouped_mm(in, weight.transpose(-2, -1), offsets);
    torch::Tensor low = at::_grouped_mm(in, down.transpose(-2, -1), offsets); // [rows, r]
    cuda::addLowRankRows(y, low, up, expertOfRow);
    ctx->save_for_backward({in, down, up, weight, offsets, expertOfRow, low});
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const torch::Tensor &in = v[0], &down = v[1], &up = v[2], &weight = v[3], &offsets = v[4], &experts = v[5],
                        &low = v[6];
    torch::Tensor dy = grads[0].contiguous();
    torch::Tensor dx = at::_grouped_mm(dy, weight, offsets);   // [rows, in]
    torch::Tensor dLow = at::_grouped_mm(dy, up, offsets);     // [rows, r]
    torch::Tensor downT = down.transpose(1, 2).contiguous();   // [E, in, r]
    cuda::addLowRankRows(dx, dLow, downT, experts);
    torch::Tensor dDown = at::_grouped_mm(dLow.t(), in, offsets); // [E, r, in]
    torch::Tensor dUp = at::_grouped_mm(dy.t(), low, offsets);    // [E, out, r]
    return {dx, dDown, dUp, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

} // namespace

torch::Tensor ExpertLinear::forward(const torch::Tensor &x, const ExpertGroups &groups) const {
  if (hasLora()) {
    auto [a, b] = groupedFactors(x.scalar_type());
#ifdef ADAPT_WITH_CUDA_KERNELS
    // The fused node where the grouped GEMM runs on the GPU for every operand.
    if (x.is_cuda() && x.size(0) > 0 && !weight.requires_grad() && cuda::lowRankSupported(a.size(1)) &&
        hasGroupedMm(x, weight) && hasGroupedMm(x, a)) {
      torch::Tensor y = ExpertLoraFunction::apply(x, a, b * scale, weight, groups.offsets, groups.expertOfRow);
      return bias.defined() ? y + bias.index_select(0, groups.expertOfRow) : y;
    }
#endif
    torch::Tensor y = groupedLinear(x, weight, groups);
    if (bias.defined())
      y = y + bias.index_select(0, groups.expertOfRow);
    // The scale joins the rank-r factor, not the [rows, out] product.
    return y + groupedLinear(groupedLinear(x, a, groups), b * scale, groups);
  }
  torch::Tensor y = groupedLinear(x, weight, groups);
  return bias.defined() ? y + bias.index_select(0, groups.expertOfRow) : y;
}

std::string AttentionLayer::indexerPath() const {
  const size_t dot = indexQ.hfPath.rfind('.');
  return def.kind != AttentionKind::SparseMla || dot == std::string::npos ? "" : indexQ.hfPath.substr(0, dot);
}

double AttentionLayer::softmaxScale() const {
  if (def.softmaxScale > 0.0)
    return def.softmaxScale;
  double scale = 1.0 / std::sqrt(static_cast<double>(def.headDim));
  if (def.kind == AttentionKind::Mla && def.rope.scaling == "yarn" && def.rope.mscaleAllDim != 0.0 &&
      def.rope.factor > 1.0) {
    double m = 0.1 * def.rope.mscaleAllDim * std::log(def.rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

torch::Tensor AttentionLayer::headNorm(const torch::Tensor &x, const torch::Tensor &weight) const {
  return zeroCentredNorms && weight.defined() ? zeroCentredRmsNorm(x, weight, normEps) : rmsNorm(x, weight, normEps);
}

namespace {

/// Llama-4's attention temperature for NoPE layers: one factor per position
/// (positions offset + 0 .. offset + seqLen - 1).
torch::Tensor temperatureScales(int64_t seqLen, int64_t offset, double floorScale, double attnScale,
                                torch::Device device) {
  torch::Tensor pos =
      torch::arange(offset, offset + seqLen, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  return torch::log1p(torch::floor((pos + 1.0) / floorScale)) * attnScale + 1.0;
}

} // namespace

torch::Tensor AttentionLayer::forward(const torch::Tensor &x, const RopeTables &rope,
                                      bool training) const {
  if (def.kind == AttentionKind::SparseMla)
    return sparseMlaForward(*this, x, rope, training);
  const int64_t batch = x.size(0), seqLen = x.size(1);
  AttentionMask mask{def.slidingWindow, def.chunkSize};
  torch::Tensor query, key, value, gate;
  auto rotate = [&](const torch::Tensor &t) {
    return def.generatedRope.empty() ? applyRope(t, rope, def.rope.interleaved)
                                     : generatedRope(def.generatedRope, t, rope, def.rope);
  };
  if (def.kind == AttentionKind::Mla) {
    const int64_t heads = def.heads;
    torch::Tensor qs = def.qLoraRank > 0
                           ? qB.forward(rmsNorm(qA.forward(x, training), qANorm, normEps), training)
                           : q.forward(x, training);
    qs = qs.view({batch, seqLen, heads, def.qkNopeDim + def.qkRopeDim}).transpose(1, 2);
    torch::Tensor qPass = qs.narrow(-1, 0, def.qkNopeDim);
    torch::Tensor qRot = qs.narrow(-1, def.qkNopeDim, def.qkRopeDim);
    torch::Tensor kv = kvA.forward(x, training);
    torch::Tensor latent = kv.narrow(-1, 0, def.kvLoraRank);
    torch::Tensor kRot = kv.narrow(-1, def.kvLoraRank, def.qkRopeDim).view({batch, 1, seqLen, def.qkRopeDim});
    if (tensorGroup) // Shared by every rank's heads: its gradient is summed over them.
      kRot = copyToTensorRegion(kRot, *tensorGroup);
    torch::Tensor kvFull = kvB.forward(rmsNorm(latent, kvANorm, normEps), training)
                               .view({batch, seqLen, heads, def.qkNopeDim + def.vHeadDim})
                               .transpose(1, 2);
    torch::Tensor kPass = kvFull.narrow(-1, 0, def.qkNopeDim);
    value = kvFull.narrow(-1, def.qkNopeDim, def.vHeadDim);
    // Kimi-Linear's MLA is NoPE: the shared key part stays unrotated.
    if (def.rope.enabled) {
      qRot = rotate(qRot);
      kRot = rotate(kRot);
    }
    kRot = kRot.expand({batch, heads, seqLen, def.qkRopeDim});
    query = torch::cat({qPass, qRot}, -1);
    key = torch::cat({kPass, kRot}, -1);
  } else {
    torch::Tensor qs = q.forward(x, training), ks = k.forward(x, training);
    if (def.outputGate) { // Qwen3-Next: per head [query, gate] in q_proj's output.
      auto halves = qs.view({batch, seqLen, def.heads, 2 * def.headDim}).chunk(2, -1);
      qs = halves[0].reshape({batch, seqLen, def.heads * def.headDim});
      gate = halves[1].reshape({batch, seqLen, def.heads * def.headDim});
    }
    value = v.forward(x, training).view({batch, seqLen, def.kvHeads, def.vHeadDim}).transpose(1, 2);
    if (def.qkNorm == "full" && tensorGroup) { // Statistics over every rank's heads.
      qs = splitWidthRmsNorm(qs, qNorm, normEps, zeroCentredNorms && qNorm.defined(), *tensorGroup);
      ks = splitWidthRmsNorm(ks, kNorm, normEps, zeroCentredNorms && kNorm.defined(), *tensorGroup);
    } else if (def.qkNorm == "full") {
      qs = headNorm(qs, qNorm);
      ks = headNorm(ks, kNorm);
    }
    query = qs.view({batch, seqLen, def.heads, def.headDim});
    key = ks.view({batch, seqLen, def.kvHeads, def.headDim});
    if (def.qkNorm == "head") {
      query = headNorm(query, qNorm);
      key = headNorm(key, kNorm);
    }
    query = query.transpose(1, 2);
    key = key.transpose(1, 2);
    if (def.rope.enabled) {
      query = rotate(query);
      key = rotate(key);
    }
    if (def.qkNorm == "l2") {
      query = rmsNorm(query, {}, normEps);
      key = rmsNorm(key, {}, normEps);
    }
    if (def.temperatureTuning && !def.rope.enabled)
      query = (query * temperatureScales(seqLen, context.offset(seqLen), def.floorScale, def.attnScale, x.device())
                           .view({1, 1, seqLen, 1}))
                  .to(query.scalar_type());
  }
  if (context.split()) { // Keys and values of every earlier part and this one.
    key = gatherEarlier(key, 2, context);
    value = gatherEarlier(value, 2, context);
    mask.queryOffset = context.offset(seqLen);
  }
  torch::Tensor out =
      def.generatedCore.empty()
          ? attention(query, key, value, softmaxScale(), mask, sinks)
          : generatedAttention(def.generatedCore, query, key, value, softmaxScale(), mask, sinks);
  out = out.transpose(1, 2).reshape({batch, seqLen, def.heads * def.vHeadDim});
  if (gate.defined())
    out = out * torch::sigmoid(gate);
  return o.forward(out, training);
}

std::string FfnLayer::blockPath() const {
  const size_t dot = router.hfPath.rfind('.');
  return dot == std::string::npos ? router.hfPath : router.hfPath.substr(0, dot);
}

bool FfnLayer::prepareRouter() {
  if (!isMoe() || router.hasLora() || router.split != TensorSplit::None || router.weight.requires_grad())
    return false;
  routerBf16 = exactBf16Weight(router.weight);
  return routerBf16.defined();
}

torch::Tensor FfnLayer::routerLogits(const torch::Tensor &flat, bool training) const {
  // In fp32, as the references compute it (some from bf16 logits; fp32 is
  // the more precise of the two). bf16 hidden states take the exact
  // tensor-core product where the weight allows it (RouterLogits.h).
  if (routerBf16.defined() && flat.scalar_type() == torch::kBFloat16) {
    torch::Tensor logits = exactRouterLogits(flat, routerBf16);
    return router.bias.defined() ? logits + router.bias.to(torch::kFloat32) : logits;
  }
  return router.forward(flat.to(torch::kFloat32), training);
}

torch::Tensor FfnLayer::forward(const torch::Tensor &x, bool training, torch::Tensor *load,
                                const torch::Tensor &forcedExperts, torch::Tensor *flips) const {
  if (!isMoe())
    return down.forward(torch::silu(gate.forward(x, training)) * up.forward(x, training), training);
  const auto shape = x.sizes().vec();
  torch::Tensor flat = x.reshape({-1, x.size(-1)});
  torch::Tensor logits = routerLogits(flat, training);
  Routing routing = route(logits, def, correctionBias);
  if (forcedExperts.defined()) {
    Routing forced = routeForced(logits, def, correctionBias, forcedExperts);
    if (flips)
      *flips = routingDifferences(routing, forced);
    routing = std::move(forced);
  }
  // Split experts: rows leave contiguous per destination rank, unpadded;
  // the ranks holding the experts pad their own groups.
  const int64_t align = groupAlignment(x.device());
  ExpertGroups groups = groupByExpert(routing, def.experts, shard.split() ? 1 : align);
  if (load)
    *load = groups.counts;
  const bool scaleInput = def.router == RouterKind::TopKSigmoidInput;
  torch::Tensor y;
  if (hasFusedExperts(*this)) { // LoRA and the combine inside one node (FusedExperts.h)
    y = fusedRoutedExperts(*this, flat, groups, routing.weights).to(flat.scalar_type());
  } else {
    torch::Tensor rows = dispatchTokens(flat, groups);
    if (scaleInput)
      rows = rows * groups.weightOfRow.to(x.scalar_type()).unsqueeze(1);
    ExpertCompute experts = [this](const torch::Tensor &in, const ExpertGroups &g) {
      return expertDown.forward(gatedActivation(gateUp.forward(in, g), interleavedGateUp, def), g);
    };
    torch::Tensor out =
        shard.split() ? dispatchToExperts(rows, groups.counts, shard, align, experts) : experts(rows, groups);
    y = combineExpertRows(out.to(flat.scalar_type()), groups, scaleInput ? torch::Tensor() : routing.weights);
  }
  if (def.sharedIntermediate > 0) {
    torch::Tensor shared = sharedDown.forward(
        torch::silu(sharedGate.forward(flat, training)) * sharedUp.forward(flat, training), training);
    if (def.sharedGate)
      shared = shared * torch::sigmoid(sharedExpertGate.forward(flat, training));
    y = y + shared;
  }
  return y.view(shape);
}

} // namespace adapt::rt
