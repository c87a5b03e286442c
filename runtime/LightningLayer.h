//===- LightningLayer.h - MiniMax lightning attention module ----*- C++ -*-===//
//
// transformers' MiniMaxLightningAttention with frozen base weights and LoRA
// adapters (module paths self_attn.qkv_proj, self_attn.output_gate,
// self_attn.out_proj, as PEFT names them):
//
//   q, k, v = split_per_head(SiLU(qkv_proj(x)))        [H, 3 d] per token
//   o       = lightning(q, k, v)                       blocked form
//   y       = out_proj(sigmoid(output_gate(x)) * RMSNorm(o))
//
// The RMSNorm spans all heads' width (H d) with eps 1e-6 (transformers builds
// it without the config's rms_norm_eps).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_LIGHTNINGLAYER_H
#define ADAPT_RUNTIME_LIGHTNINGLAYER_H

#include "runtime/Layers.h"

#include <vector>

namespace adapt::rt {

/// One lightning attention layer (AttentionKind::Lightning).
struct LightningLayer {
  LinearAttentionDef def;
  LoraLinear qkvProj, outputGate, outProj;
  torch::Tensor norm;   ///< [heads * headDim], the output RMSNorm's weight.
  torch::Tensor slopes; ///< [heads] fp32 decay rates of this layer (lightningSlopes).
  /// Context parallelism: this rank's part of the sequence (the parts'
  /// states are all-gathered, no tag needed).
  ContextSplit context;
  /// Tensor parallelism: the group over which the output norm's statistics
  /// are summed (each rank holds whole heads). Null: not split.
  Collectives *tensorGroup = nullptr;

  /// Sets the decay slopes for decoder layer \p layerIndex of def.decayLayers.
  void setLayer(int64_t layerIndex);
  /// x [B, T, hidden] -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor &x, bool training) const;
  /// The adaptable projections, for LoRA injection, export and merging.
  std::vector<LoraLinear *> linears() { return {&qkvProj, &outputGate, &outProj}; }
  std::vector<const LoraLinear *> linears() const { return {&qkvProj, &outputGate, &outProj}; }
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LIGHTNINGLAYER_H
