//===- FusedExperts.cpp - routed experts with LoRA folded into the GEMMs ---===//
//
// Buffers of one forward, R rows, hidden K, expert width I, rank r:
//   xCat  [R, K + r]    the gathered token rows | x A1^T
//   h     [R, 2I]       gate_up's output (SwiGLU's input)
//   actCat [R, I + r]   SwiGLU's output | act A2^T
//   y     [R, K]        the expert rows, combined into the [T, K] output
//                       and freed: the backward does not need them
// and of the backward, which runs on g [R, K], each row's token's output
// gradient unweighted (zero on padding rows), the routing weights applied
// only to [R, r] factors and in the final sum over a token's rows:
//   dActCat [R, I + r]  g [W2 | s B2]: the activation's gradient | g s B2;
//                       its row dot with actCat is the routing weight's
//                       gradient g . y (y = actCat [W2 | s B2]^T)
//   dhCat [R, 2I + r]   SwiGLU's input gradient | dh s B1
// So the node keeps ~(K + 2I + I) values per row, not the K more of y that
// a combine after it would keep for the weights' gradient (Qwen3-30B-A3B:
// 4 KB less per row, 33 KB per token and MoE layer at top-8). With
// recomputeInputs it keeps only h of the three, plus the tokens [T, K] and
// the narrow x A1^T and act A2^T [R, r], and rebuilds xCat (a gather) and
// actCat (SwiGLU of h) in the backward pass: 2I + 2r values per row and K
// per token (Qwen3-30B-A3B: ~40 KB less per token and layer).
// The weight buffers are [E, N + r, K + r] (FusedExperts.h). Their spare
// rows and columns receive this step's factors at every forward; they are
// kept in the node's saved data, not saved for backward, because a later
// micro-batch's forward rewrites them (with the same values: the factors
// change only at the optimizer step) before this one's backward.
//
//===----------------------------------------------------------------------===//

#include "runtime/FusedExperts.h"

#include <torch/autograd.h>

#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/ExpertCombineKernel.h"
#include "runtime/cuda/FactorLayoutKernel.h"
#include "runtime/cuda/LowRankKernel.h"
#include "runtime/cuda/SwiGluKernel.h"
#endif

namespace adapt::rt {

namespace {

//===-- The element-wise steps: the GPU's kernels, or LibTorch ops --------===//

/// out = tokens[tokenOfRow], \p out possibly the first columns of a buffer.
void gatherInto(const torch::Tensor &tokens, const torch::Tensor &tokenOfRow, torch::Tensor out) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (tokens.is_cuda() && cuda::gatherRowsInto(tokens, tokenOfRow, out))
    return;
#endif
  out.copy_(tokens.index_select(0, tokenOfRow));
}

/// out = silu(gate) * up over \p h [R, 2I], in fp32, rounded once.
void swiGluInto(const torch::Tensor &h, torch::Tensor out) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (h.is_cuda())
    return cuda::swiGluForwardInto(h, out);
#endif
  const int64_t width = h.size(1) / 2;
  torch::Tensor gate = h.narrow(1, 0, width).to(torch::kFloat32), up = h.narrow(1, width, width).to(torch::kFloat32);
  out.copy_(torch::silu(gate) * up);
}

/// grad = d SwiGLU(h) / d h given the output's gradient \p gradOut, in fp32.
void swiGluBackwardInto(const torch::Tensor &h, const torch::Tensor &gradOut, torch::Tensor grad) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (h.is_cuda())
    return cuda::swiGluBackwardInto(h, gradOut, grad);
#endif
  const int64_t width = h.size(1) / 2;
  torch::Tensor gate = h.narrow(1, 0, width).to(torch::kFloat32), up = h.narrow(1, width, width).to(torch::kFloat32);
  torch::Tensor go = gradOut.to(torch::kFloat32), s = torch::sigmoid(gate);
  grad.narrow(1, 0, width).copy_(go * up * s * (1.0 + gate * (1.0 - s)));
  grad.narrow(1, width, width).copy_(go * gate * s);
}

/// out[i] += low[i] @ factor[expertOfRow[i]]^T, in fp32, rounded once;
/// \p factor [E, N, r] contiguous.
void addLowRankInto(torch::Tensor out, const torch::Tensor &low, const torch::Tensor &factor,
                    const torch::Tensor &expertOfRow) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (out.is_cuda())
    return cuda::addLowRankRows(out, low, factor, expertOfRow);
#endif
  torch::Tensor perRow = factor.index_select(0, expertOfRow).to(torch::kFloat32); // [R, N, r]
  torch::Tensor term = torch::bmm(perRow, low.to(torch::kFloat32).unsqueeze(2)).squeeze(2);
  out.copy_(out.to(torch::kFloat32) + term);
}

/// out[t] = sum over t's k pairs p of weights[p] * rows[rowOfPair[p]], in
/// fp32, rounded once to rows' dtype (\p weights [T, k]): the node's
/// combine forward, and the sum of a token's input gradient rows backward.
torch::Tensor weightedTokenSum(const torch::Tensor &rows, const torch::Tensor &rowOfPair, int64_t k,
                               const torch::Tensor &weights) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (rows.is_cuda() && rowOfPair.size(0) > 0)
    return cuda::combineRows(rows, rowOfPair, weights, k);
#endif
  const int64_t tokens = rowOfPair.size(0) / k;
  return (rows.index_select(0, rowOfPair).to(torch::kFloat32).view({tokens, k, rows.size(1)}) *
          weights.to(torch::kFloat32).view({tokens, k, 1}))
      .sum(1)
      .to(rows.scalar_type());
}

/// g [R, K]: row rowOfPair[p] = gradOut[p / k], unweighted; padding rows
/// (owned by no pair) zero.
torch::Tensor tokenGradientRows(const torch::Tensor &gradOut, const torch::Tensor &rowOfPair, int64_t k,
                                int64_t rows) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (gradOut.is_cuda() && rowOfPair.size(0) > 0)
    return cuda::combineRowsGradRows(gradOut, rowOfPair, torch::Tensor(), k, rows);
#endif
  const int64_t tokens = gradOut.size(0), width = gradOut.size(1);
  return torch::zeros({rows, width}, gradOut.options())
      .index_copy_(0, rowOfPair, gradOut.unsqueeze(1).expand({tokens, k, width}).reshape({tokens * k, width}));
}

/// What the forward keeps for the backward: the gathered rows and SwiGLU's
/// output whole, or (recomputeInputs) what rebuilds them.
struct KeptRows {
  torch::Tensor xCat, actCat;            ///< Whole: [R, K + r], [R, I + r].
  torch::Tensor tokens, xLow, actLow;    ///< Rebuilding: [T, K], [R, r], [R, r].
};

/// xCat and actCat as the forward had them: kept, or rebuilt from the
/// tokens (gathered by \p tokenOfRow) and h (SwiGLU) beside their saved
/// rank-r columns. The same values either way.
std::pair<torch::Tensor, torch::Tensor> rowsForBackward(const KeptRows &kept, const torch::Tensor &h,
                                                        const torch::Tensor &tokenOfRow) {
  if (kept.xCat.defined())
    return {kept.xCat, kept.actCat};
  const int64_t rows = h.size(0), hidden = kept.tokens.size(1), width = h.size(1) / 2, rank = kept.xLow.size(1);
  torch::Tensor xCat = torch::empty({rows, hidden + rank}, h.options());
  gatherInto(kept.tokens, tokenOfRow, xCat.narrow(1, 0, hidden));
  xCat.narrow(1, hidden, rank).copy_(kept.xLow);
  torch::Tensor actCat = torch::empty({rows, width + rank}, h.options());
  swiGluInto(h, actCat.narrow(1, 0, width));
  actCat.narrow(1, width, rank).copy_(kept.actLow);
  return {xCat, actCat};
}

/// A weight buffer's parts: the frozen weight [E, N, K], the up factor's
/// columns [E, N, r] and the down factor's rows [E, r, K].
struct PaddedParts {
  torch::Tensor weight, upColumns, downRows;
};

PaddedParts partsOf(const torch::Tensor &padded, int64_t rank) {
  const int64_t n = padded.size(1) - rank, k = padded.size(2) - rank;
  return {padded.narrow(1, 0, n).narrow(2, 0, k), padded.narrow(1, 0, n).narrow(2, k, rank),
          padded.narrow(1, n, rank).narrow(2, 0, k)};
}

/// This step's factors into a buffer's spare rows and columns: A [E*r, K]
/// (PEFT rows e*r + k) and s*B, B [N, r*E] (PEFT columns k*E + e).
void writeFactors(const torch::Tensor &padded, const torch::Tensor &a, const torch::Tensor &b, double scale) {
  torch::NoGradGuard noGrad;
  const int64_t experts = padded.size(0), rank = a.size(0) / experts;
  PaddedParts p = partsOf(padded, rank);
  p.downRows.copy_(a.view({experts, rank, a.size(1)}));
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (cuda::factorToExpertColumns(b, scale, p.upColumns))
    return;
#endif
  p.upColumns.copy_(b.view({b.size(0), rank, experts}).permute({2, 0, 1}) * scale);
}

/// The gradient of A [E*r, in] (PEFT's layout, fp32): per expert, the sum
/// over its rows of dLow[i]^T in[i] (\p dLow [R, r], \p in [R, in]).
torch::Tensor gradientOfA(const torch::Tensor &dLow, const torch::Tensor &in, const torch::Tensor &offsets) {
  const int64_t experts = offsets.size(0), rank = dLow.size(1), width = in.size(1);
  return at::_grouped_mm(dLow.t(), in, offsets).reshape({experts * rank, width}).to(torch::kFloat32);
}

/// The gradient of B [out, r*E] (PEFT's layout, fp32) of s*B: per expert,
/// s times the sum over its rows of dOut[i]^T low[i] (\p dOut [R, out], \p
/// low [R, r]).
torch::Tensor gradientOfB(const torch::Tensor &dOut, const torch::Tensor &low, const torch::Tensor &offsets,
                          double scale) {
  const int64_t experts = offsets.size(0), rank = low.size(1), width = dOut.size(1);
  const torch::Tensor columns = at::_grouped_mm(dOut.t(), low, offsets); // [E, out, r]
  return (columns.to(torch::kFloat32) * scale).permute({1, 2, 0}).reshape({width, rank * experts});
}

/// Rows [R, K] times [E, N, K]^T per expert group: [R, N].
torch::Tensor groupedTimesT(const torch::Tensor &rows, const torch::Tensor &w, const torch::Tensor &offsets) {
  return at::_grouped_mm(rows, w.transpose(-2, -1), offsets);
}

/// The node (file comment). Inputs: tokens [T, K]; the routing weights [T,
/// k] (pair p = t * k + j); the adapters' fp32 factors in PEFT's layout, a1
/// [E*r, K], b1 [2I, r*E], a2 [E*r, I], b2 [K, r*E], and their scales; the
/// two weight buffers, into whose spare rows and columns the forward writes
/// the factors (bf16, B scaled); \p recomputeInputs (file comment). Output:
/// the combined [T, K].
struct RoutedExpertsFunction : torch::autograd::Function<RoutedExpertsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &tokens,
                               const torch::Tensor &weights, const torch::Tensor &a1, const torch::Tensor &b1, const torch::Tensor &a2,
                               const torch::Tensor &b2, const torch::Tensor &padded1, const torch::Tensor &padded2,
                               const torch::Tensor &offsets, const torch::Tensor &expertOfRow,
                               const torch::Tensor &tokenOfRow, const torch::Tensor &rowOfPair, int64_t k,
                               double scale1, double scale2, bool recomputeInputs) {
    const int64_t experts = padded1.size(0), rank = a1.size(0) / experts, hidden = tokens.size(1),
                  width = a2.size(1), rows = tokenOfRow.size(0);
    writeFactors(padded1, a1, b1, scale1);
    writeFactors(padded2, a2, b2, scale2);
    PaddedParts p1 = partsOf(padded1, rank), p2 = partsOf(padded2, rank);
    const auto opts = tokens.options();
    torch::Tensor xCat = torch::empty({rows, hidden + rank}, opts);
    gatherInto(tokens, tokenOfRow, xCat.narrow(1, 0, hidden));
    xCat.narrow(1, hidden, rank).copy_(groupedTimesT(xCat.narrow(1, 0, hidden), p1.downRows, offsets));
    torch::Tensor h = groupedTimesT(xCat, padded1.narrow(1, 0, 2 * width), offsets); // [R, 2I]
    torch::Tensor actCat = torch::empty({rows, width + rank}, opts);
    swiGluInto(h, actCat.narrow(1, 0, width));
    actCat.narrow(1, width, rank).copy_(groupedTimesT(actCat.narrow(1, 0, width), p2.downRows, offsets));
    torch::Tensor y = groupedTimesT(actCat, padded2.narrow(1, 0, hidden), offsets); // [R, K]
    if (recomputeInputs) // clones: a narrow view would keep its whole buffer alive
      ctx->save_for_backward({h, offsets, expertOfRow, rowOfPair, weights, tokenOfRow, tokens,
                              xCat.narrow(1, hidden, rank).clone(), actCat.narrow(1, width, rank).clone()});
    else
      ctx->save_for_backward({h, offsets, expertOfRow, rowOfPair, weights, xCat, actCat});
    ctx->saved_data["padded1"] = padded1;
    ctx->saved_data["padded2"] = padded2;
    ctx->saved_data["k"] = k;
    ctx->saved_data["scale1"] = scale1;
    ctx->saved_data["scale2"] = scale2;
    ctx->saved_data["recomputeInputs"] = recomputeInputs;
    return weightedTokenSum(y, rowOfPair, k, weights);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const torch::Tensor &h = v[0], &offsets = v[1], &experts = v[2], &rowOfPair = v[3], &weights = v[4];
    const bool rebuild = ctx->saved_data["recomputeInputs"].toBool();
    const KeptRows kept = rebuild ? KeptRows{{}, {}, v[6], v[7], v[8]} : KeptRows{v[5], v[6], {}, {}, {}};
    const auto [xCat, actCat] = rowsForBackward(kept, h, rebuild ? v[5] : torch::Tensor());
    const torch::Tensor padded1 = ctx->saved_data["padded1"].toTensor(), padded2 = ctx->saved_data["padded2"].toTensor();
    const int64_t k = ctx->saved_data["k"].toInt();
    const int64_t rank = padded1.size(1) - h.size(1), hidden = xCat.size(1) - rank, width = actCat.size(1) - rank;
    const int64_t rows = xCat.size(0);
    PaddedParts p1 = partsOf(padded1, rank), p2 = partsOf(padded2, rank);
    const torch::Tensor g = tokenGradientRows(grads[0].contiguous(), rowOfPair, k, rows); // [R, K], unweighted
    // The backward runs on the unweighted g; each row's routing weight
    // enters where a tensor is narrow (the [R, r] factors of the LoRA
    // gradients) and in the final sum over a token's rows. Every step
    // between is linear in its gradient, so this is dy = w g throughout.
    const torch::Tensor weightOfRow = torch::zeros({rows}, weights.options().dtype(torch::kFloat32))
                                          .index_copy_(0, rowOfPair, weights.reshape({-1}).to(torch::kFloat32))
                                          .unsqueeze(1);
    auto weighted = [&](const torch::Tensor &narrow) { return (narrow * weightOfRow).to(narrow.scalar_type()); };
    const double scale1 = ctx->saved_data["scale1"].toDouble(), scale2 = ctx->saved_data["scale2"].toDouble();

    // Down: [d act | dLow2] = g [W2 | s B2], then d act += dLow2 A2. The
    // first product's row dot with actCat is g . y (y = actCat [W2 | s
    // B2]^T), the routing weight's gradient.
    torch::Tensor dActCat = at::_grouped_mm(g, padded2.narrow(1, 0, hidden), offsets); // [R, I + r]
    torch::Tensor dWeights;
    if (ctx->needs_input_grad(1)) {
      torch::Tensor dots;
#ifdef ADAPT_WITH_CUDA_KERNELS
      if (dActCat.is_cuda()) // One pass, fp32 products (no [R, I + r] product tensor).
        dots = cuda::rowDots(dActCat, actCat);
#endif
      if (!dots.defined())
        dots = (dActCat * actCat).sum(1, /*keepdim=*/false, torch::kFloat32);
      dWeights = dots.index_select(0, rowOfPair)
                     .view(weights.sizes())
                     .to(weights.scalar_type());
    }
    torch::Tensor dAct = dActCat.narrow(1, 0, width), dLow2 = dActCat.narrow(1, width, rank);
    addLowRankInto(dAct, dLow2, p2.downRows.transpose(1, 2).contiguous(), experts);
    torch::Tensor dA2 = gradientOfA(weighted(dLow2), actCat.narrow(1, 0, width), offsets);
    torch::Tensor dB2 = gradientOfB(g, weighted(actCat.narrow(1, width, rank)), offsets, scale2);

    // SwiGLU, then gate_up: d x = [dh | dh s B1] [W1 ; A1].
    torch::Tensor dhCat = torch::empty({rows, h.size(1) + rank}, h.options());
    torch::Tensor dh = dhCat.narrow(1, 0, h.size(1));
    swiGluBackwardInto(h, dAct, dh);
    torch::Tensor dLow1 = at::_grouped_mm(dh, p1.upColumns, offsets); // [R, r]
    dhCat.narrow(1, h.size(1), rank).copy_(dLow1);
    torch::Tensor dx = at::_grouped_mm(dhCat, padded1.narrow(2, 0, hidden), offsets); // [R, K]
    torch::Tensor dA1 = gradientOfA(weighted(dLow1), xCat.narrow(1, 0, hidden), offsets);
    torch::Tensor dB1 = gradientOfB(dh, weighted(xCat.narrow(1, hidden, rank)), offsets, scale1);
    torch::Tensor dTokens = weightedTokenSum(dx, rowOfPair, k, weights);
    return {dTokens, dWeights, dA1, dB1, dA2, dB2, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

/// The rank both expert projections' adapters share, or 0.
int64_t sharedRank(const FfnLayer &f) {
  if (!f.gateUp.hasLora() || !f.expertDown.hasLora())
    return 0;
  const int64_t experts = f.gateUp.weight.size(0);
  const int64_t r1 = f.gateUp.loraA.size(0) / experts, r2 = f.expertDown.loraA.size(0) / experts;
  return r1 == r2 ? r1 : 0;
}

} // namespace

bool fusedExpertsSupported(const FfnLayer &f) {
  const ExpertLinear &up = f.gateUp, &down = f.expertDown;
  if (!f.isMoe() || !up.weight.defined() || !down.weight.defined() || f.shard.split())
    return false;
  const int64_t rank = sharedRank(f);
  const FfnDef &d = f.def;
  if (rank <= 0 || rank > 32 || rank % 8 != 0 || up.bias.defined() || down.bias.defined() || f.interleavedGateUp ||
      up.peftSwapped || down.peftSwapped || d.act != ExpertAct::SwiGLU || !d.generatedActivation.empty() ||
      d.router == RouterKind::TopKSigmoidInput)
    return false;
  const int64_t hidden = up.weight.size(2), width = down.weight.size(2);
  if (up.weight.size(1) != 2 * width || down.weight.size(1) != hidden || hidden % 8 != 0 || width % 8 != 0)
    return false;
  const auto dtype = up.weight.scalar_type();
  return up.weight.is_cuda() ? dtype == torch::kBFloat16
                             : up.weight.is_cpu() && (dtype == torch::kBFloat16 || dtype == torch::kFloat32);
}

bool prepareFusedExperts(FfnLayer &f) {
  if (hasFusedExperts(f))
    return true;
  if (!fusedExpertsSupported(f))
    return false;
  const int64_t rank = sharedRank(f);
  for (ExpertLinear *x : {&f.gateUp, &f.expertDown}) {
    const torch::Tensor w = x->weight;
    torch::Tensor padded = torch::zeros({w.size(0), w.size(1) + rank, w.size(2) + rank}, w.options());
    padded.narrow(1, 0, w.size(1)).narrow(2, 0, w.size(2)).copy_(w);
    x->padded = padded;
    x->weight = partsOf(padded, rank).weight;
  }
  return true;
}

bool hasFusedExperts(const FfnLayer &f) { return f.gateUp.padded.defined() && f.expertDown.padded.defined(); }

torch::Tensor fusedRoutedExperts(const FfnLayer &f, const torch::Tensor &tokens, const ExpertGroups &groups,
                                 const torch::Tensor &weights) {
  const auto dtype = f.gateUp.weight.scalar_type();
  return RoutedExpertsFunction::apply(tokens.to(dtype).contiguous(), weights, f.gateUp.loraA, f.gateUp.loraB,
                                      f.expertDown.loraA, f.expertDown.loraB, f.gateUp.padded,
                                      f.expertDown.padded, groups.offsets, groups.expertOfRow, groups.tokenOfRow,
                                      groups.rowOfPair, groups.pairsPerToken, f.gateUp.scale, f.expertDown.scale,
                                      f.recomputeExpertInputs);
}

} // namespace adapt::rt
