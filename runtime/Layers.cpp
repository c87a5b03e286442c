//===- Layers.cpp - modules with weights: linear+LoRA, attention, FFN -----===//

#include "runtime/Layers.h"
#include "runtime/ExpertRows.h"
#include "runtime/FusedExperts.h"
#include "runtime/KernelLedger.h"
#include "runtime/RouterLogits.h"
#include "runtime/SparseAttention.h"

#include "runtime/LinearAttention.h"
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/LowRankKernel.h"
#endif

#include <algorithm>
#include <cmath>

namespace adapt::rt {

namespace {

/// Frozen linears that read one input, each with or without its LoRA
/// adapter, as one autograd node: y_i = x W_i^T + b_i + (x A_i^T)(s_i B_i)^T.
/// - Forward: the members' rank-r down-projections are one GEMM over their
///   stacked A (x is read once, not once per member), and each up-projection
///   accumulates into its base output in place (addmm_, beta = 1).
/// - Backward: every member's input gradient accumulates into one tensor in
///   place (addmm_), so neither a [tokens, in] gradient per member and per
///   adapter nor the adds autograd would make of them exist (profiled at
///   ~0.1 ms per MoE layer for q/k/v/o on the H200, docs/performance.md,
///   seventh round); the stacked A get their gradients from one GEMM.
/// The factors come as fp32 adapters and get fp32 gradients; the frozen
/// weights and biases get none. \p inputs: x, then per member A, B (empty
/// without LoRA), W and bias (empty without one); \p scales per member.
struct LoraGroupFunction : torch::autograd::Function<LoraGroupFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, at::TensorList inputs,
                                                std::vector<double> scales) {
    const torch::Tensor &x = inputs[0];
    const int64_t members = static_cast<int64_t>(scales.size());
    const auto dtype = x.scalar_type();
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
    std::vector<torch::Tensor> factorsA, scaledB(members), weights(members);
    std::vector<int64_t> ranks(members, 0);
    for (int64_t i = 0; i < members; ++i) {
      const torch::Tensor &a = inputs[1 + 4 * i], &b = inputs[2 + 4 * i];
      weights[i] = inputs[3 + 4 * i];
      if (a.numel() == 0)
        continue;
      ranks[i] = a.size(0);
      factorsA.push_back(a.to(dtype));
      scaledB[i] = (b * scales[i]).to(dtype);
    }
    const torch::Tensor stackedA = factorsA.empty()       ? torch::Tensor()
                                   : factorsA.size() == 1 ? factorsA[0]
                                                          : torch::cat(factorsA, 0);
    const torch::Tensor down = stackedA.defined() ? torch::mm(x2, stackedA.t()) : torch::Tensor(); // [tokens, sum r]
    torch::autograd::variable_list outputs;
    for (int64_t i = 0, column = 0; i < members; column += ranks[i], ++i) {
      const torch::Tensor &bias = inputs[4 + 4 * i];
      torch::Tensor y = torch::linear(x2, weights[i], bias.numel() > 0 ? bias : torch::Tensor());
      if (ranks[i] > 0)
        y.addmm_(down.narrow(1, column, ranks[i]), scaledB[i].t());
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = weights[i].size(0);
      outputs.push_back(y.view(shape));
    }
    torch::autograd::variable_list saved{x2, stackedA, down};
    saved.insert(saved.end(), weights.begin(), weights.end());
    saved.insert(saved.end(), scaledB.begin(), scaledB.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["ranks"] = ranks;
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["scales"] = scales;
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const auto v = ctx->get_saved_variables();
    const torch::Tensor &x2 = v[0], &stackedA = v[1], &down = v[2];
    const std::vector<int64_t> ranks = ctx->saved_data["ranks"].toIntVector();
    const std::vector<double> scales = ctx->saved_data["scales"].toDoubleVector();
    const int64_t members = static_cast<int64_t>(ranks.size());
    auto weight = [&](int64_t i) -> const torch::Tensor & { return v[3 + i]; };
    auto scaledB = [&](int64_t i) -> const torch::Tensor & { return v[3 + members + i]; };
    // A member whose output got no gradient contributes none.
    auto gradOf = [&](int64_t i) {
      return grads[i].defined() ? grads[i].reshape({-1, weight(i).size(0)}) : torch::Tensor();
    };
    std::vector<torch::Tensor> dDownParts;
    for (int64_t i = 0; i < members; ++i)
      if (ranks[i] > 0) {
        const torch::Tensor dy = gradOf(i);
        dDownParts.push_back(dy.defined() ? torch::mm(dy, scaledB(i)) : torch::zeros({x2.size(0), ranks[i]}, x2.options()));
      }
    const torch::Tensor dDown = dDownParts.empty()       ? torch::Tensor()
                                : dDownParts.size() == 1 ? dDownParts[0]
                                                         : torch::cat(dDownParts, 1); // [tokens, sum r]
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) { // not for a first layer's frozen embeddings
      for (int64_t i = 0; i < members; ++i)
        if (const torch::Tensor dy = gradOf(i); dy.defined())
          dx = dx.defined() ? dx.addmm_(dy, weight(i)) : torch::mm(dy, weight(i));
      if (dx.defined() && dDown.defined())
        dx.addmm_(dDown, stackedA);
      if (dx.defined())
        dx = dx.view(ctx->saved_data["shape"].toIntVector());
    }
    const torch::Tensor dStackedA = dDown.defined() ? torch::mm(dDown.t(), x2).to(torch::kFloat32) : torch::Tensor();
    torch::autograd::variable_list result{dx};
    for (int64_t i = 0, row = 0; i < members; row += ranks[i], ++i) {
      torch::Tensor dA, dB;
      if (ranks[i] > 0) {
        // Each member's own tensor: an optimizer may keep the gradient.
        dA = ranks[i] == dStackedA.size(0) ? dStackedA : dStackedA.narrow(0, row, ranks[i]).clone();
        const torch::Tensor dy = gradOf(i);
        dB = dy.defined() ? torch::mm(dy.t(), down.narrow(1, row, ranks[i])).to(torch::kFloat32) * scales[i]
                          : torch::zeros({weight(i).size(0), ranks[i]}, dStackedA.options());
      }
      result.insert(result.end(), {dA, dB, torch::Tensor(), torch::Tensor()});
    }
    result.push_back(torch::Tensor()); // for the scales
    return result;
  }
};

/// \p linears (each joinsGroupNode) on \p x through LoraGroupFunction.
std::vector<torch::Tensor> groupNode(const std::vector<const LoraLinear *> &linears, const torch::Tensor &x) {
  const torch::Tensor none = torch::empty({0}, x.options());
  std::vector<torch::Tensor> inputs{x};
  std::vector<double> scales;
  for (const LoraLinear *l : linears) {
    inputs.insert(inputs.end(), {l->hasLora() ? l->loraA : none, l->hasLora() ? l->loraB : none, l->weight,
                                 l->bias.defined() ? l->bias : none});
    scales.push_back(l->scale);
  }
  return LoraGroupFunction::apply(at::TensorList(inputs), scales);
}

} // namespace

bool LoraLinear::joinsGroupNode(const torch::Tensor &x, bool training) const {
  const bool adaptersFp32 = !hasLora() || (loraA.scalar_type() == torch::kFloat32 && loraB.scalar_type() == torch::kFloat32);
  return adaptersFp32 && !(hasLora() && training && dropout > 0.0) && split == TensorSplit::None &&
         !weight.requires_grad() && !(bias.defined() && bias.requires_grad()) && x.dim() >= 1 && x.numel() > 0;
}

std::vector<torch::Tensor> LoraLinear::forwardShared(const std::vector<const LoraLinear *> &linears,
                                                     const torch::Tensor &x, bool training) {
  const bool oneNode = std::all_of(linears.begin(), linears.end(),
                                   [&](const LoraLinear *l) { return l->joinsGroupNode(x, training); });
  std::vector<torch::Tensor> outputs;
  if (!oneNode) {
    for (const LoraLinear *l : linears)
      outputs.push_back(l->forward(x, training));
    return outputs;
  }
  return groupNode(linears, x);
}

torch::Tensor LoraLinear::forward(const torch::Tensor &input, bool training) const {
  // One node with in-place accumulation where the LoRA input is the base
  // input and the frozen parts are plain (LoraGroupFunction).
  if (hasLora() && joinsGroupNode(input, training))
    return groupNode({this}, input)[0];
  // Column-parallel: the whole input, whose gradient the group sums.
  const torch::Tensor x = split == TensorSplit::Columns ? copyToTensorRegion(input, *tensorGroup) : input;
  // Row-parallel: the bias joins once, after the partial outputs are summed.
  const bool rows = split == TensorSplit::Rows;
  const bool dropping = training && dropout > 0.0;
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
    if (x.size(0) > 0 && chooseKernel("experts.lora_grouped_gemm", x, !weight.requires_grad(),
                                      x.is_cuda() && cuda::lowRankSupported(a.size(1)) && hasGroupedMm(x, weight) &&
                                          hasGroupedMm(x, a))) {
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
    const std::vector<torch::Tensor> fromX =
        LoraLinear::forwardShared({def.qLoraRank > 0 ? &qA : &q, &kvA}, x, training);
    torch::Tensor qs = def.qLoraRank > 0 ? qB.forward(rmsNorm(fromX[0], qANorm, normEps), training) : fromX[0];
    qs = qs.view({batch, seqLen, heads, def.qkNopeDim + def.qkRopeDim}).transpose(1, 2);
    torch::Tensor qPass = qs.narrow(-1, 0, def.qkNopeDim);
    torch::Tensor qRot = qs.narrow(-1, def.qkNopeDim, def.qkRopeDim);
    const torch::Tensor &kv = fromX[1];
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
    const std::vector<torch::Tensor> qkv = LoraLinear::forwardShared({&q, &k, &v}, x, training);
    torch::Tensor qs = qkv[0], ks = qkv[1];
    if (def.outputGate) { // Qwen3-Next: per head [query, gate] in q_proj's output.
      auto halves = qs.view({batch, seqLen, def.heads, 2 * def.headDim}).chunk(2, -1);
      qs = halves[0].reshape({batch, seqLen, def.heads * def.headDim});
      gate = halves[1].reshape({batch, seqLen, def.heads * def.headDim});
    }
    value = qkv[2].view({batch, seqLen, def.kvHeads, def.vHeadDim}).transpose(1, 2);
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
  if (!isMoe()) {
    const std::vector<torch::Tensor> gateUp = LoraLinear::forwardShared({&gate, &up}, x, training);
    return down.forward(torch::silu(gateUp[0]) * gateUp[1], training);
  }
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
    std::vector<const LoraLinear *> readers{&sharedGate, &sharedUp};
    if (def.sharedGate)
      readers.push_back(&sharedExpertGate);
    const std::vector<torch::Tensor> in = LoraLinear::forwardShared(readers, flat, training);
    torch::Tensor shared = sharedDown.forward(torch::silu(in[0]) * in[1], training);
    if (def.sharedGate)
      shared = shared * torch::sigmoid(in[2]);
    y = y + shared;
  }
  return y.view(shape);
}

} // namespace adapt::rt
