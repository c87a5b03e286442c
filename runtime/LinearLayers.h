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

/// Qwen3-Next's Gated DeltaNet (transformers' Qwen3NextGatedDeltaNet).
///
/// in_proj_qkvz holds, per key head g, [q_g (dk), k_g (dk), v (r dv), z (r dv)]
/// for the r = valueHeads / keyHeads value heads of that group; in_proj_ba
/// holds per key head [b (r), a (r)]. q, k, v pass the causal convolution
/// (+SiLU); q and k are L2-normalised and repeated to the value heads;
/// beta = sigmoid(b), decay = -exp(A_log) softplus(a + dt_bias); the gated
/// delta rule runs chunked; its output passes the gated RMSNorm with z and
/// out_proj.
struct GatedDeltaNetLayer {
  LinearAttentionDef def;
  double normEps = 1e-6;
  LoraLinear inProjQkvz, inProjBa, outProj;
  torch::Tensor conv;    ///< [2 keyDim + valueDim, 1, K].
  torch::Tensor aLog;    ///< [valueHeads].
  torch::Tensor dtBias;  ///< [valueHeads].
  torch::Tensor norm;    ///< [valueHeadDim], the gated norm's weight.

  /// x [B, T, hidden] -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor &x, bool training) const;
  /// The adaptable projections, for LoRA injection, export and merging.
  std::vector<LoraLinear *> linears() { return {&inProjQkvz, &inProjBa, &outProj}; }
  std::vector<const LoraLinear *> linears() const { return {&inProjQkvz, &inProjBa, &outProj}; }
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LINEARLAYERS_H
