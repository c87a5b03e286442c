//===- LinearLayers.cpp - linear attention modules with weights -----------===//

#include "runtime/LinearLayers.h"

#include "runtime/LinearAttention.h"

#include <array>

namespace adapt::rt {

namespace {

/// Tags of the convolution halo exchange: apart from the states' (layer index).
constexpr int kHaloTags = 1 << 20;

/// The delta rule over this rank's part of the sequence: from the state the
/// previous part leaves (zeros alone or on the first part), passing this
/// part's leaving state on. \p token (undefined unless a state was passed
/// on) must be added to the layer's output: it brings the next part's
/// gradient for that state back in the backward pass.
torch::Tensor deltaRuleOverPart(const DeltaRuleInputs &in, const LinearAttentionDef &def, const ContextSplit &cp,
                                int64_t layerIndex, torch::Tensor &token) {
  if (!cp.split())
    return gatedDeltaRuleSegmented(in, def.chunkSize, def.segmentTokens);
  const int tag = static_cast<int>(layerIndex);
  const std::vector<int64_t> shape = {in.key.size(0), in.key.size(1), in.key.size(3), in.value.size(3)};
  torch::Tensor entering =
      stateFromPrevious(in.key, shape, in.key.options().dtype(torch::kFloat32), cp, tag);
  torch::Tensor leaving;
  torch::Tensor out = gatedDeltaRuleSegmented(in, def.chunkSize, def.segmentTokens, entering, &leaving);
  token = passStateOn(leaving, cp, tag);
  return out;
}

/// The convolution's K-1 inputs just before this part (undefined when
/// alone), while this part's last K-1 go on to the next; \p token as for
/// deltaRuleOverPart.
torch::Tensor convolutionHalo(const torch::Tensor &mixed, const torch::Tensor &conv, const ContextSplit &cp,
                              int64_t layerIndex, torch::Tensor &token) {
  if (!cp.split())
    return torch::Tensor();
  const int64_t rows = conv.size(-1) - 1;
  const int tag = static_cast<int>(layerIndex) + kHaloTags;
  torch::Tensor halo = stateFromPrevious(mixed, {mixed.size(0), rows, mixed.size(2)}, mixed.options(), cp, tag);
  token = passStateOn(mixed.narrow(1, mixed.size(1) - rows, rows), cp, tag);
  return halo;
}

/// The short causal convolution over \p mixed (query, key and value channels
/// side by side), the context-parallel halo included (\p haloToken as for
/// convolutionHalo), split back into [B, T, heads, dim] per part.
std::array<torch::Tensor, 3> convolvedQkv(const torch::Tensor &mixed, const torch::Tensor &conv, const ContextSplit &cp,
                                          int64_t layerIndex, torch::Tensor &haloToken, int64_t keyHeads,
                                          int64_t keyDim, int64_t valueHeads, int64_t valueDim) {
  torch::Tensor convolved = causalConv1dSilu(mixed, conv, convolutionHalo(mixed, conv, cp, layerIndex, haloToken));
  const int64_t batch = mixed.size(0), seqLen = mixed.size(1);
  auto qkv = torch::split_with_sizes(convolved, {keyHeads * keyDim, keyHeads * keyDim, valueHeads * valueDim}, -1);
  return {qkv[0].reshape({batch, seqLen, keyHeads, keyDim}), qkv[1].reshape({batch, seqLen, keyHeads, keyDim}),
          qkv[2].reshape({batch, seqLen, valueHeads, valueDim})};
}

/// The delta rule's inputs from [B, T, heads, ...] tensors: heads before
/// time, query and key L2-normalised in fp32 (as the reference kernel).
DeltaRuleInputs deltaInputs(const torch::Tensor &query, const torch::Tensor &key, const torch::Tensor &value,
                            const torch::Tensor &decay, const torch::Tensor &beta) {
  return {l2Normalize(query.to(torch::kFloat32)).transpose(1, 2), l2Normalize(key.to(torch::kFloat32)).transpose(1, 2),
          value.transpose(1, 2), decay.transpose(1, 2), beta.transpose(1, 2)};
}

/// Adds the exchange tokens (undefined ones skipped) to a layer's output.
torch::Tensor withTokens(torch::Tensor out, const torch::Tensor &a, const torch::Tensor &b) {
  for (const torch::Tensor *t : {&a, &b})
    if (t->defined())
      out = out + *t;
  return out;
}

} // namespace

torch::Tensor GatedDeltaNetLayer::forward(const torch::Tensor &x, bool training) const {
  const int64_t batch = x.size(0), seqLen = x.size(1);
  const int64_t keyHeads = def.keyHeads, valueHeads = def.valueHeads;
  const int64_t dk = def.keyHeadDim, dv = def.valueHeadDim;
  const int64_t perGroup = valueHeads / keyHeads; // value heads per key head
  const int64_t keyDim = keyHeads * dk, valueDim = valueHeads * dv;

  // Per key-head group: q, k, v, z and b, a, as transformers splits them.
  torch::Tensor qkvz = inProjQkvz.forward(x, training).view({batch, seqLen, keyHeads, 2 * dk + 2 * perGroup * dv});
  torch::Tensor ba = inProjBa.forward(x, training).view({batch, seqLen, keyHeads, 2 * perGroup});
  auto parts = torch::split_with_sizes(qkvz, {dk, dk, perGroup * dv, perGroup * dv}, 3);
  torch::Tensor z = parts[3].reshape({batch, seqLen, valueHeads, dv});
  auto gates = torch::split_with_sizes(ba, {perGroup, perGroup}, 3);
  torch::Tensor b = gates[0].reshape({batch, seqLen, valueHeads});
  torch::Tensor a = gates[1].reshape({batch, seqLen, valueHeads});

  torch::Tensor mixed = torch::cat({parts[0].reshape({batch, seqLen, keyDim}), parts[1].reshape({batch, seqLen, keyDim}),
                                    parts[2].reshape({batch, seqLen, valueDim})},
                                   -1);
  torch::Tensor haloToken;
  auto [query, key, value] = convolvedQkv(mixed, conv, context, layerIndex, haloToken, keyHeads, dk, valueHeads, dv);

  torch::Tensor beta = torch::sigmoid(b);
  torch::Tensor decay = -aLog.to(torch::kFloat32).exp() * torch::softplus(a.to(torch::kFloat32) + dtBias);
  if (perGroup > 1) {
    query = query.repeat_interleave(perGroup, 2);
    key = key.repeat_interleave(perGroup, 2);
  }
  torch::Tensor token;
  torch::Tensor core = deltaRuleOverPart(deltaInputs(query, key, value, decay, beta), def, context, layerIndex, token)
                           .transpose(1, 2)
                           .to(x.scalar_type());
  core = gatedRmsNorm(core, norm, z, normEps);
  torch::Tensor out = outProj.forward(core.reshape({batch, seqLen, valueDim}), training);
  return withTokens(out, token, haloToken);
}

torch::Tensor KimiDeltaLayer::forward(const torch::Tensor &x, bool training) const {
  const int64_t batch = x.size(0), seqLen = x.size(1);
  const int64_t heads = def.keyHeads, d = def.keyHeadDim, width = heads * d;
  torch::Tensor mixed = torch::cat({q.forward(x, training), k.forward(x, training), v.forward(x, training)}, -1);
  torch::Tensor haloToken;
  auto [query, key, value] = convolvedQkv(mixed, conv, context, layerIndex, haloToken, heads, d, heads, d);

  // Per-channel log decay, in fp32.
  torch::Tensor forget = fB.forward(fA.forward(x, training), training).to(torch::kFloat32) + dtBias.to(torch::kFloat32);
  torch::Tensor decay = -aLog.to(torch::kFloat32).exp().view({1, 1, heads, 1}) *
                        torch::softplus(forget.view({batch, seqLen, heads, d}));
  torch::Tensor beta = torch::sigmoid(b.forward(x, training));

  torch::Tensor token;
  torch::Tensor core = deltaRuleOverPart(deltaInputs(query, key, value, decay, beta), def, context, layerIndex, token)
                           .transpose(1, 2)
                           .to(x.scalar_type());
  torch::Tensor gate = gB.forward(gA.forward(x, training), training).view({batch, seqLen, heads, d});
  core = sigmoidGatedRmsNorm(core, norm, gate, normEps);
  torch::Tensor out = o.forward(core.reshape({batch, seqLen, width}), training);
  return withTokens(out, token, haloToken);
}

} // namespace adapt::rt
