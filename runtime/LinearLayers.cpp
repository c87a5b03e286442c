//===- LinearLayers.cpp - linear attention modules with weights -----------===//

#include "runtime/LinearLayers.h"

#include "runtime/LinearAttention.h"
#include "runtime/Recompute.h"

#include <algorithm>
#include <array>

namespace adapt::rt {

namespace {

/// Tags of the convolution tail's exchange: apart from the states' (layer index).
constexpr int kHaloTags = 1 << 20;

/// The short causal convolution over \p mixed (query, key and value channels
/// side by side) after \p entering's tail, split back into [B, T, heads, dim]
/// per part; \p leaving (when given) gets the stretch's last K-1 inputs.
std::array<torch::Tensor, 3> convolvedQkv(const torch::Tensor &mixed, const torch::Tensor &conv,
                                          const CarriedState &entering, CarriedState *leaving, int64_t keyHeads,
                                          int64_t keyDim, int64_t valueHeads, int64_t valueDim) {
  torch::Tensor convolved = causalConv1dSilu(mixed, conv, entering.convTail);
  if (leaving) {
    const int64_t rows = conv.size(-1) - 1;
    // A stretch shorter than the tail keeps part of the entering one.
    torch::Tensor seen = mixed.size(1) >= rows || !entering.convTail.defined()
                             ? mixed
                             : torch::cat({entering.convTail.to(mixed.scalar_type()), mixed}, 1);
    // A copy, not a view: it outlives the stretch (and its recomputation).
    leaving->convTail =
        seen.narrow(1, std::max<int64_t>(0, seen.size(1) - rows), std::min(rows, seen.size(1))).clone();
  }
  const int64_t batch = mixed.size(0), seqLen = mixed.size(1);
  auto qkv = torch::split_with_sizes(convolved, {keyHeads * keyDim, keyHeads * keyDim, valueHeads * valueDim}, -1);
  return {qkv[0].reshape({batch, seqLen, keyHeads, keyDim}), qkv[1].reshape({batch, seqLen, keyHeads, keyDim}),
          qkv[2].reshape({batch, seqLen, valueHeads, valueDim})};
}

/// The delta rule over one stretch, from \p entering's state, filling
/// \p leaving's; [B, T, heads, dv] in \p dtype. Unsegmented: the layer
/// runs long sequences in segments itself (forwardInSegments).
torch::Tensor deltaRuleStretch(const DeltaRuleInputs &in, const LinearAttentionDef &def,
                               const CarriedState &entering, CarriedState *leaving, torch::ScalarType dtype) {
  return gatedDeltaRuleSegmented(in, def.chunkSize, /*segmentTokens=*/0, entering.state,
                                 leaving ? &leaving->state : nullptr)
      .transpose(1, 2)
      .to(dtype);
}

/// A tensor that needs a gradient whenever anything in \p layer does (a
/// trainable LoRA factor or weight, else the input \p x): the context-parallel
/// exchange hangs its backward on it (stateFromPrevious), so rank c sends
/// its state gradient back exactly when rank c-1 waits for one.
template <typename Layer> torch::Tensor gradientAnchor(const Layer &layer, const torch::Tensor &x) {
  for (const LoraLinear *linear : layer.linears())
    if (linear->hasLora() && linear->loraA.requires_grad())
      return linear->loraA;
  for (const torch::Tensor *t : {&layer.conv, &layer.norm, &layer.aLog, &layer.dtBias})
    if (t->defined() && t->requires_grad())
      return *t;
  return x;
}

/// Runs \p layer over this rank's part of the sequence: from the state the
/// previous rank's part leaves (context parallelism; zeros alone or on the
/// first part), in segments of def.segmentTokens (whole chunks) that are
/// recomputed in the backward pass from their input and entering state, and
/// passes the last segment's leaving state on to the next rank. \p
/// stateShape is the delta rule's [B, heads, dk, dv].
template <typename Layer>
torch::Tensor forwardInSegments(const Layer &layer, const torch::Tensor &x, bool training,
                                const std::vector<int64_t> &stateShape) {
  const LinearAttentionDef &def = layer.def;
  const ContextSplit &cp = layer.context;
  const int64_t seqLen = x.size(1);
  const int64_t segment = def.segmentTokens > 0 ? deltaRuleSegmentLength(def.segmentTokens, def.chunkSize) : seqLen;
  if (!cp.split() && segment >= seqLen)
    return layer.forwardStretch(x, training, {}, nullptr);

  const int tag = static_cast<int>(layer.layerIndex);
  const torch::Tensor anchor = gradientAnchor(layer, x);
  CarriedState carried;
  // The same order as the sends below: the convolution's tail, then the state.
  carried.convTail = stateFromPrevious(anchor, {x.size(0), layer.conv.size(-1) - 1, layer.conv.size(0)},
                                       x.options(), cp, tag + kHaloTags);
  carried.state = stateFromPrevious(anchor, stateShape, x.options().dtype(torch::kFloat32), cp, tag);

  std::vector<torch::Tensor> outs;
  if (segment >= seqLen) { // Context parallelism alone: nothing to recompute.
    CarriedState leaving;
    outs.push_back(layer.forwardStretch(x, training, carried, &leaving));
    carried = leaving;
  } else {
    RecomputedFunctions stretch = [&layer, training](const std::vector<torch::Tensor> &in) {
      CarriedState leaving;
      torch::Tensor out = layer.forwardStretch(in[0], training, {in[1], in[2]}, &leaving);
      return std::vector<torch::Tensor>{out, leaving.convTail, leaving.state};
    };
    for (const torch::Tensor &part : x.split(segment, 1)) {
      std::vector<torch::Tensor> r = recompute(stretch, {part, carried.convTail, carried.state});
      outs.push_back(r[0]);
      carried = {r[1], r[2]};
    }
  }
  torch::Tensor out = outs.size() == 1 ? outs[0] : torch::cat(outs, 1);
  // Each token brings the next rank's gradient for what was sent back in.
  const torch::Tensor tailToken = passStateOn(carried.convTail, cp, tag + kHaloTags);
  const torch::Tensor stateToken = passStateOn(carried.state, cp, tag);
  for (const torch::Tensor *token : {&tailToken, &stateToken})
    if (token->defined())
      out = out + *token;
  return out;
}

} // namespace

torch::Tensor GatedDeltaNetLayer::forward(const torch::Tensor &x, bool training) const {
  return forwardInSegments(*this, x, training, {x.size(0), def.valueHeads, def.keyHeadDim, def.valueHeadDim});
}

torch::Tensor GatedDeltaNetLayer::forwardStretch(const torch::Tensor &x, bool training, const CarriedState &entering,
                                                 CarriedState *leaving) const {
  const int64_t batch = x.size(0), seqLen = x.size(1);
  const int64_t keyHeads = def.keyHeads, valueHeads = def.valueHeads;
  const int64_t dk = def.keyHeadDim, dv = def.valueHeadDim;
  const int64_t perGroup = valueHeads / keyHeads; // value heads per key head
  const int64_t keyDim = keyHeads * dk, valueDim = valueHeads * dv;

  // Per key-head group: q, k, v, z and b, a, as transformers splits them.
  const std::vector<torch::Tensor> projected = LoraLinear::forwardShared({&inProjQkvz, &inProjBa}, x, training);
  torch::Tensor qkvz = projected[0].view({batch, seqLen, keyHeads, 2 * dk + 2 * perGroup * dv});
  torch::Tensor ba = projected[1].view({batch, seqLen, keyHeads, 2 * perGroup});
  auto parts = torch::split_with_sizes(qkvz, {dk, dk, perGroup * dv, perGroup * dv}, 3);
  torch::Tensor z = parts[3].reshape({batch, seqLen, valueHeads, dv});
  auto gates = torch::split_with_sizes(ba, {perGroup, perGroup}, 3);
  torch::Tensor b = gates[0].reshape({batch, seqLen, valueHeads});
  torch::Tensor a = gates[1].reshape({batch, seqLen, valueHeads});

  torch::Tensor mixed = torch::cat({parts[0].reshape({batch, seqLen, keyDim}), parts[1].reshape({batch, seqLen, keyDim}),
                                    parts[2].reshape({batch, seqLen, valueDim})},
                                   -1);
  auto [query, key, value] = convolvedQkv(mixed, conv, entering, leaving, keyHeads, dk, valueHeads, dv);

  torch::Tensor beta = torch::sigmoid(b);
  torch::Tensor decay = -aLog.to(torch::kFloat32).exp() * torch::softplus(a.to(torch::kFloat32) + dtBias);
  // q and k normalised per key head, then repeated to the value heads (the
  // same rows as transformers' repeat-then-normalise, at half the work).
  DeltaRuleInputs in = deltaInputs(query, key, value, decay, beta);
  if (perGroup > 1) {
    in.query = in.query.repeat_interleave(perGroup, 1);
    in.key = in.key.repeat_interleave(perGroup, 1);
  }
  torch::Tensor core = deltaRuleStretch(in, def, entering, leaving, x.scalar_type());
  core = gatedRmsNorm(core, norm, z, normEps);
  return outProj.forward(core.reshape({batch, seqLen, valueDim}), training);
}

torch::Tensor KimiDeltaLayer::forward(const torch::Tensor &x, bool training) const {
  return forwardInSegments(*this, x, training, {x.size(0), def.keyHeads, def.keyHeadDim, def.keyHeadDim});
}

torch::Tensor KimiDeltaLayer::forwardStretch(const torch::Tensor &x, bool training, const CarriedState &entering,
                                             CarriedState *leaving) const {
  const int64_t batch = x.size(0), seqLen = x.size(1);
  const int64_t heads = def.keyHeads, d = def.keyHeadDim, width = heads * d;
  // Every projection of x: q, k, v, the decay's and the gate's first
  // factors, and beta's.
  const std::vector<torch::Tensor> p = LoraLinear::forwardShared({&q, &k, &v, &fA, &gA, &b}, x, training);
  torch::Tensor mixed = torch::cat({p[0], p[1], p[2]}, -1);
  auto [query, key, value] = convolvedQkv(mixed, conv, entering, leaving, heads, d, heads, d);

  // Per-channel log decay, in fp32.
  torch::Tensor forget = fB.forward(p[3], training).to(torch::kFloat32) + dtBias.to(torch::kFloat32);
  torch::Tensor decay = -aLog.to(torch::kFloat32).exp().view({1, 1, heads, 1}) *
                        torch::softplus(forget.view({batch, seqLen, heads, d}));
  torch::Tensor beta = torch::sigmoid(p[5]);

  torch::Tensor core =
      deltaRuleStretch(deltaInputs(query, key, value, decay, beta), def, entering, leaving, x.scalar_type());
  torch::Tensor gate = gB.forward(p[4], training).view({batch, seqLen, heads, d});
  core = sigmoidGatedRmsNorm(core, norm, gate, normEps);
  return o.forward(core.reshape({batch, seqLen, width}), training);
}

} // namespace adapt::rt
