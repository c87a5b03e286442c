//===- Layers.h - modules with weights: linear+LoRA, attention, FFN -*- C++ -*-===//
//
// Each module holds frozen base tensors (never requiring gradients) and,
// where a LoRA target matched, fp32 adapter tensors that do. Adapters are
// applied in the activation dtype (cast per forward) so that bf16 training
// keeps using bf16 matmuls and grouped GEMMs, while the optimizer updates the
// fp32 master copies.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_LAYERS_H
#define ADAPT_RUNTIME_LAYERS_H

#include "runtime/ContextParallel.h"
#include "runtime/ExpertParallel.h"
#include "runtime/ModelDef.h"
#include "runtime/Ops.h"
#include "runtime/TensorParallel.h"

#include <torch/torch.h>

#include <string>

namespace adapt::rt {

/// A frozen nn.Linear-like layer with an optional LoRA adapter:
/// y = x W^T + b + scale * dropout(x) A^T B^T.
struct LoraLinear {
  torch::Tensor weight;   ///< [out, in], frozen.
  torch::Tensor bias;     ///< [out] or undefined.
  torch::Tensor loraA;    ///< [r, in] fp32, trainable; undefined without LoRA.
  torch::Tensor loraB;    ///< [out, r] fp32, trainable, zero-initialised.
  double scale = 0.0;
  double dropout = 0.0;
  std::string hfPath;     ///< Module path in the HF model ("model.layers.0.self_attn.q_proj").
  std::string checkpointName; ///< The weight's checkpoint name.
  /// Tensor parallelism: which part of weight/bias/LoRA this rank holds, and
  /// the group holding the rest (TensorParallel.h). None: all of it.
  TensorSplit split = TensorSplit::None;
  Collectives *tensorGroup = nullptr;

  bool hasLora() const { return loraA.defined(); }
  torch::Tensor forward(const torch::Tensor &x, bool training) const;
  /// The outputs of \p linears that all read \p x (q/k/v; an MLP's gate and
  /// up), in order: as one autograd node that reads x once for every
  /// adapter's down-projection and sums the input gradients in place, where
  /// each member allows it (joinsGroupNode); else one forward each.
  static std::vector<torch::Tensor> forwardShared(const std::vector<const LoraLinear *> &linears,
                                                  const torch::Tensor &x, bool training);
  /// Whether this linear can run inside the shared-input node on \p x:
  /// frozen weight and bias, fp32 adapters (or none), no dropout in
  /// training, not split by tensor parallelism.
  bool joinsGroupNode(const torch::Tensor &x, bool training) const;
};

/// One fused tensor of all routed experts, [E, out, in], with grouped LoRA
/// (A [E, r, in], B [E, out, r]) applied inside the grouped GEMM path.
struct ExpertLinear {
  torch::Tensor weight;   ///< [E, out, in], frozen.
  torch::Tensor bias;     ///< [E, out] or undefined.
  torch::Tensor loraA;    ///< [E*r, in] fp32, PEFT layout (row e*r + k).
  torch::Tensor loraB;    ///< [out, r*E] fp32, PEFT layout (column k*E + e).
  double scale = 0.0;
  std::string hfParam;    ///< "model.layers.0.mlp.experts.gate_up_proj".
  /// PEFT reads a 3-D expert parameter as [E, out, in] unless its module says
  /// it is transposed; transformers' Llama-4 experts hold [E, in, out] without
  /// saying so, and PEFT's lora_A then spans our outputs and lora_B our
  /// inputs: A [E*r, out], B [in, r*E].
  bool peftSwapped = false;
  /// [E, out + r, in + r] holding weight and spare room for the LoRA factors,
  /// where the routed experts run fused (FusedExperts.h; weight is then a
  /// view of it); undefined otherwise.
  torch::Tensor padded;

  /// The adapter as grouped weights: A [E, r, in] and B [E, out, r], in
  /// \p dtype, from the PEFT-layout tensors.
  std::pair<torch::Tensor, torch::Tensor> groupedFactors(torch::ScalarType dtype) const;

  bool hasLora() const { return loraA.defined(); }
  /// \p x rows sorted by expert as \p groups says; returns [rows, out].
  torch::Tensor forward(const torch::Tensor &x, const ExpertGroups &groups) const;
};

/// Attention (GQA/MHA or MLA) of one layer.
struct AttentionLayer {
  AttentionDef def;
  double normEps = 1e-6;
  LoraLinear q, k, v, o;                 ///< GQA; MLA uses q (no q-LoRA) and o.
  LoraLinear qA, qB, kvA, kvB;           ///< MLA projections.
  torch::Tensor qNorm, kNorm, sinks;     ///< GQA extras.
  torch::Tensor qANorm, kvANorm;         ///< MLA norms.
  /// SparseMla's lightning indexer (wq_b, wk, weights_proj; weights_proj in
  /// fp32): it only selects keys, so it gets no gradient (SparseAttention.h).
  LoraLinear indexQ, indexK, indexWeights;
  torch::Tensor indexKNorm, indexKNormBias; ///< The indexer's k_norm (LayerNorm).
  /// The indexer's choice replaced for this step by a given one ([B, T, k']
  /// int64 key positions, k' = min(top_k, T)): transformers' choice in loss
  /// alignment, as Model::forceRouting forces the experts. Undefined: its own.
  torch::Tensor forcedSelection;
  /// Zero-centred q/k norms (Qwen3-Next, ModelDef::normWeightOffset): scale 1 + weight.
  bool zeroCentredNorms = false;
  /// Context parallelism: this rank's part of the sequence; its queries
  /// attend to the keys and values of every earlier part and its own.
  ContextSplit context;
  /// Tensor parallelism (whole heads per rank): the group, for what all
  /// heads share (MLA's rotary key, the latent of DSA's absorbed form, a
  /// full-width QK norm). Null: not split.
  Collectives *tensorGroup = nullptr;

  torch::Tensor forward(const torch::Tensor &x, const RopeTables &rope, bool training) const;
  /// The indexer's module path in the HF model
  /// ("model.layers.1.self_attn.indexer"); "" for a layer without one.
  std::string indexerPath() const;
  /// Softmax scale, including YaRN's mscale^2 for MLA.
  double softmaxScale() const;
  /// The q/k RMSNorm with \p weight (undefined: weightless), zero-centred when asked.
  torch::Tensor headNorm(const torch::Tensor &x, const torch::Tensor &weight) const;
  /// Every linear a LoRA adapter can attach to, in the adapters' order.
  std::vector<LoraLinear *> linears() { return {&q, &k, &v, &o, &qA, &qB, &kvA, &kvB, &indexQ, &indexK, &indexWeights}; }
  std::vector<const LoraLinear *> linears() const {
    return {&q, &k, &v, &o, &qA, &qB, &kvA, &kvB, &indexQ, &indexK, &indexWeights};
  }
};

/// Dense gated MLP or mixture of experts.
struct FfnLayer {
  FfnDef def;
  LoraLinear gate, up, down;             ///< Dense MLP.
  LoraLinear router;
  /// The router weight in bf16 where it is exactly bf16 and frozen
  /// (prepareRouter): bf16 hidden states then get their fp32 logits from
  /// one tensor-core GEMM (RouterLogits.h). Undefined: the fp32 product.
  torch::Tensor routerBf16;
  torch::Tensor correctionBias;          ///< [E] or undefined.
  ExpertLinear gateUp, expertDown;       ///< Routed experts.
  LoraLinear sharedGate, sharedUp, sharedDown, sharedExpertGate;
  bool interleavedGateUp = false;
  /// Expert parallelism: which routed experts gateUp/expertDown hold (their
  /// first dimension) and the group holding the rest. Default: all of them.
  ExpertShard shard;
  /// ModelOptions::recomputeExpertInputs, for the fused experts' node.
  bool recomputeExpertInputs = false;

  bool isMoe() const { return def.experts > 0; }
  /// \p load receives tokens per expert when this is a MoE layer. Defined
  /// \p forcedExperts [tokens, k] replace the router's choice (routeForced);
  /// then \p flips receives how many tokens the router would have sent
  /// elsewhere (an int64 scalar on the device: nothing is read back).
  torch::Tensor forward(const torch::Tensor &x, bool training, torch::Tensor *load,
                        const torch::Tensor &forcedExperts = {}, torch::Tensor *flips = nullptr) const;
  /// The MoE block's module path ("model.layers.3.mlp"): the parent of the router's.
  std::string blockPath() const;
  /// Every linear a LoRA adapter can attach to (not the routed experts), in
  /// the adapters' order.
  std::vector<LoraLinear *> linears() {
    return {&router, &gate, &up, &down, &sharedGate, &sharedUp, &sharedDown, &sharedExpertGate};
  }
  std::vector<const LoraLinear *> linears() const {
    return {&router, &gate, &up, &down, &sharedGate, &sharedUp, &sharedDown, &sharedExpertGate};
  }
  /// Sets routerBf16 where the router is frozen (no LoRA), unsplit, and its
  /// weight exactly bf16; returns whether it did.
  bool prepareRouter();
  /// The router's fp32 logits of \p flat [tokens, hidden].
  torch::Tensor routerLogits(const torch::Tensor &flat, bool training) const;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LAYERS_H
