//===- LinearLayers.h - linear attention modules with weights --*- C++ -*-===//
//
// Token mixers with a recurrent state instead of a KV cache, built on the
// kernels of LinearAttention.h, holding frozen base weights and LoRA
// adapters like the modules of Layers.h.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_LINEARLAYERS_H
#define ADAPT_RUNTIME_LINEARLAYERS_H

#include "runtime/Layers.h"

namespace adapt::rt {

/// What one stretch of a sequence hands the next through a delta-rule mixer:
/// everything the rest of the sequence needs from it. Stretches are this
/// rank's part of the sequence (context parallelism) and, within it, the
/// segments that forward() recomputes in the backward pass.
struct CarriedState {
  torch::Tensor convTail; ///< [B, K-1, channels]: the convolution's last inputs, in the activations' dtype.
  torch::Tensor state;    ///< [B, heads, dk, dv] fp32: the delta rule's state.
};

/// What the delta-rule mixers share: their definition, the short
/// convolution, the decay and gate parameters, and their place in a
/// context-parallel run. Each mixer's forward(x, training) maps
/// [B, T, hidden] -> [B, T, hidden]; sequences longer than def.segmentTokens
/// run in segments, each recomputed in the backward pass from its input and
/// the CarriedState entering it, so a layer keeps one segment's activations,
/// not the whole sequence's (what lets one layer train at 512K tokens); the
/// values are those of one pass. forwardStretch(x, training, entering,
/// leaving) is the mixer over one stretch from \p entering (undefined
/// members: the sequence's start), filling \p leaving when given.
struct DeltaRuleMixer {
  LinearAttentionDef def;
  double normEps = 1e-6;
  torch::Tensor conv;   ///< [channels, 1, K]: the q, k and v channels' convolutions.
  torch::Tensor aLog;   ///< The decay's per-head log rate.
  torch::Tensor dtBias; ///< Added to the decay's input before softplus.
  torch::Tensor norm;   ///< The gated output norm's weight.
  /// Context parallelism: this rank's part of the sequence, and the layer's
  /// index (the tag of its state exchange).
  ContextSplit context;
  int64_t layerIndex = 0;
};

/// Qwen3-Next's Gated DeltaNet (transformers' Qwen3NextGatedDeltaNet).
///
/// in_proj_qkvz holds, per key head g, [q_g (dk), k_g (dk), v (r dv), z (r dv)]
/// for the r = valueHeads / keyHeads value heads of that group; in_proj_ba
/// holds per key head [b (r), a (r)]. q, k, v pass the causal convolution
/// (+SiLU; conv [2 keyDim + valueDim, 1, K]); q and k are L2-normalised and
/// repeated to the value heads; beta = sigmoid(b), decay = -exp(A_log)
/// softplus(a + dt_bias) (aLog and dtBias [valueHeads]); the gated delta rule
/// runs chunked; its output passes the gated RMSNorm with z (norm
/// [valueHeadDim]) and out_proj.
struct GatedDeltaNetLayer : DeltaRuleMixer {
  LoraLinear inProjQkvz, inProjBa, outProj;

  torch::Tensor forward(const torch::Tensor &x, bool training) const;
  torch::Tensor forwardStretch(const torch::Tensor &x, bool training, const CarriedState &entering,
                               CarriedState *leaving) const;
  /// The adaptable projections, for LoRA injection, export and merging.
  std::vector<LoraLinear *> linears() { return {&inProjQkvz, &inProjBa, &outProj}; }
  std::vector<const LoraLinear *> linears() const { return {&inProjQkvz, &inProjBa, &outProj}; }
};

/// Kimi-Linear's delta attention (transformers' KimiLinearDeltaAttention):
/// H heads of width d for q, k and v.
///
/// q, k, v = q_proj(x), k_proj(x), v_proj(x), each through its causal
/// convolution (+SiLU; the three stacked in conv [3 H d, 1, K]); q, k
/// L2-normalised; a per-channel decay g = -exp(A_log[h]) softplus(f_b(f_a(x))
/// + dt_bias) (aLog [H] fp32, dtBias [H d]); beta = sigmoid(b_proj(x)); the
/// gated delta rule runs chunked; its output passes the sigmoid-gated RMSNorm
/// (norm [d]) with gate g_b(g_a(x)) and o_proj. f_a/f_b sit in transformers'
/// forget_gate submodule, which their PEFT paths follow.
struct KimiDeltaLayer : DeltaRuleMixer {
  LoraLinear q, k, v, fA, fB, b, gA, gB, o;

  torch::Tensor forward(const torch::Tensor &x, bool training) const;
  torch::Tensor forwardStretch(const torch::Tensor &x, bool training, const CarriedState &entering,
                               CarriedState *leaving) const;
  std::vector<LoraLinear *> linears() { return {&q, &k, &v, &fA, &fB, &b, &gA, &gB, &o}; }
  std::vector<const LoraLinear *> linears() const { return {&q, &k, &v, &fA, &fB, &b, &gA, &gB, &o}; }
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LINEARLAYERS_H
