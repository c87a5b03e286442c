//===- AdaptOps.td - adapt dialect operations --------------*- tablegen -*-===//
#ifndef ADAPT_OPS_TD
#define ADAPT_OPS_TD

include "ir/AdaptDialect.td"
include "ir/AdaptAttrs.td"

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Adapt_ModelOp : Adapt_Op<"model", [
    Symbol, SymbolTable, IsolatedFromAbove, NoTerminator,
    SingleBlock]> {
  let summary = "A whole model: its weights and its component graph";
  let arguments = (ins SymbolNameAttr:$sym_name,
                       StrAttr:$model_type,
                       StrAttr:$family,
                       PositiveI64Attr:$hidden,
                       PositiveI64Attr:$vocab,
                       DefaultValuedAttr<StrAttr, "\"\"">:$architecture,
                       // adapt plan's layout, [tp, ep, pp, cp, dp], and its
                       // recomputation choice (adapt-apply-plan).
                       OptionalAttr<DenseI64ArrayAttr>:$parallel_layout,
                       UnitAttr:$recompute);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
}

def Adapt_WeightOp : Adapt_Op<"weight", [Symbol, HasParent<"ModelOp">]> {
  let summary = "A checkpoint tensor, named by its manifest name";
  let description = [{
    The symbol is the tensor's name in the checkpoint. Routed experts are one
    symbol whose type leads with the expert count: with `per_expert`, the
    checkpoint holds one tensor per expert and `{e}` in the name stands for
    the expert number; without it, one fused tensor. `shard` and
    `disk_dtype` are attached by the manifest check; `lora` ({rank, alpha,
    module}: the adapter and the Hugging Face module it adapts) by
    adapt-inject-lora.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<AnyRankedTensor>:$type,
                       StrAttr:$role,
                       UnitAttr:$per_expert,
                       UnitAttr:$routed,
                       UnitAttr:$linear,
                       OptionalAttr<StrAttr>:$shard,
                       OptionalAttr<StrAttr>:$disk_dtype,
                       OptionalAttr<DictionaryAttr>:$lora);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of elements over all experts.
    int64_t getNumElements();
  }];
}

def Adapt_OutputOp : Adapt_Op<"output", [HasParent<"ModelOp">]> {
  let summary = "The model's results (logits, encoder features)";
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

def Adapt_AddOp : Adapt_Op<"add", [Pure, SameOperandsAndResultType]> {
  let summary = "Residual connection";
  let description = [{
    result = residual_alpha * lhs + residual_beta * rhs: lhs is the residual,
    rhs the sublayer's output. MiniMax scales both (layernorm_*_alpha/beta);
    with MiniMax-M1's postnorm the residual lhs is the sublayer's normalised
    input rather than the layer input.
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs,
                   DefaultValuedAttr<F64Attr, "1.0">:$residual_alpha,
                   DefaultValuedAttr<F64Attr, "1.0">:$residual_beta);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Components
//===----------------------------------------------------------------------===//

/// Every component names the decoder layer it belongs to (-1: none) and the
/// weights it reads, and verifies them against its hyper-parameters.
class Adapt_ComponentOp<string mnemonic, dag componentArgs,
                        list<Trait> traits = []>
    : Adapt_Op<mnemonic, !listconcat(traits, [
        DeclareOpInterfaceMethods<SymbolUserOpInterface>])> {
  let arguments = !con((ins Variadic<AnyRankedTensor>:$inputs,
                            DefaultValuedAttr<I64Attr, "-1">:$layer,
                            FlatSymbolRefArrayAttr:$weights),
                       componentArgs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat =
      "$inputs attr-dict `:` functional-type($inputs, $result)";
}

def Adapt_EmbeddingOp : Adapt_ComponentOp<"embedding", (ins)> {
  let summary = "Token embedding lookup";
}

def Adapt_RMSNormOp : Adapt_ComponentOp<"rms_norm",
    (ins DefaultValuedAttr<F64Attr, "1e-6">:$eps, UnitAttr:$zero_centred)> {
  let summary = "RMS normalisation with a learned scale";
  let description = [{
    y = x / rms(x) * w, or with `zero_centred` (Qwen3-Next) y = x / rms(x) * (1 + w).
  }];
}

def Adapt_AttentionOp : Adapt_ComponentOp<"attention", (ins
    Adapt_AttentionKindAttr:$kind,
    PositiveI64Attr:$num_heads, PositiveI64Attr:$num_kv_heads,
    PositiveI64Attr:$head_dim, PositiveI64Attr:$v_head_dim,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$q_lora_rank,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$kv_lora_rank,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$qk_rope_head_dim,
    Adapt_RopeAttr:$rope, DefaultValuedAttr<F64Attr, "1.0">:$rope_partial,
    DefaultValuedAttr<Adapt_WindowKindAttr, "::adapt::WindowKind::None">:$window,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$window_size,
    UnitAttr:$qk_norm,
    DefaultValuedAttr<Adapt_QkNormKindAttr, "::adapt::QkNormKind::Head">:$qk_norm_kind,
    // M-RoPE (rope's scaling mrope): frequencies per position axis (t, h, w).
    OptionalAttr<DenseI64ArrayAttr>:$mrope_section,
    UnitAttr:$out_bias,
    // Settings (runtime/ModelDef.h, AttentionSettings and visitSettings):
    // copied from the config as they are, by that list, in the importer and
    // in codegen. A new one is declared here with the runtime's default.
    UnitAttr:$qkv_bias, UnitAttr:$output_gate, UnitAttr:$sinks,
    DefaultValuedAttr<F64Attr, "0.0">:$softmax_scale,
    UnitAttr:$temperature_tuning,
    DefaultValuedAttr<F64Attr, "8192.0">:$floor_scale,
    DefaultValuedAttr<F64Attr, "0.1">:$attn_scale)> {
  let summary = "Softmax attention: MHA, GQA or MLA";
  let description = [{
    `kind` is `mha`, `gqa` or `mla`. GQA: q_proj is
    [num_heads * head_dim * (output_gate ? 2 : 1), hidden], k/v_proj are
    [num_kv_heads * head_dim, hidden]. MLA: kv_b_proj is
    [num_heads * (head_dim - qk_rope_head_dim + v_head_dim), kv_lora_rank].

    RoPE rotates the first head_dim * rope_partial dims (MLA:
    qk_rope_head_dim) as `rope` (#adapt.rope) says: its base, pairs or
    halves, and its scaling (`none`: NoPE).
    `qk_norm_kind`: `head` (RMSNorm per head), `full` (over all heads'
    width) or `l2` (weightless). `softmax_scale` 0 means 1/sqrt(head_dim).
    `temperature_tuning` scales q by
    log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1 (Llama-4 NoPE).
  }];
  let hasVerifier = 1;
}

def Adapt_SparseAttentionOp : Adapt_ComponentOp<"sparse_attention", (ins
    PositiveI64Attr:$num_heads, PositiveI64Attr:$head_dim,
    PositiveI64Attr:$v_head_dim,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$q_lora_rank,
    PositiveI64Attr:$kv_lora_rank, PositiveI64Attr:$qk_rope_head_dim,
    // MLA's rotary embedding, as adapt.attention spells it.
    Adapt_RopeAttr:$rope,
    PositiveI64Attr:$index_heads, PositiveI64Attr:$index_head_dim,
    PositiveI64Attr:$top_k,
    DefaultValuedAttr<F64Attr, "0.0">:$softmax_scale,
    UnitAttr:$out_bias,
    // The indexer rotates adjacent pairs (GLM-5) instead of halves (DeepSeek-V3.2).
    UnitAttr:$index_rope_interleaved,
    // GLM-5 "shared" layers: no indexer weights; the top-k of the previous
    // layer that ran its own indexer is reused.
    UnitAttr:$reuses_indexer)> {
  let summary = "DeepSeek sparse attention: lightning indexer, top-k, MLA";
  let description = [{
    Each query attends to the `top_k` keys its indexer scores highest:
    out = MLA(q, K[topk(indexer(q, K))]). The indexer's wq_b is
    [index_heads * index_head_dim, q_lora_rank]; its scores are
    sum_h w_h relu(q_h . k / sqrt(index_head_dim)) with w = weights_proj(x) /
    sqrt(index_heads), k = LayerNorm(wk x), RoPE on the first
    qk_rope_head_dim dims of q and k (pairs when `index_rope_interleaved`,
    else halves). MLA's RoPE attributes mean what adapt.attention's do;
    `softmax_scale` 0 means 1/sqrt(head_dim).
  }];
  let hasVerifier = 1;
}

def Adapt_LinearAttentionOp : Adapt_ComponentOp<"linear_attention", (ins
    Adapt_LinearAttentionKindAttr:$kind,
    PositiveI64Attr:$key_heads, PositiveI64Attr:$value_heads,
    PositiveI64Attr:$key_head_dim, PositiveI64Attr:$value_head_dim,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$conv_kernel,
    UnitAttr:$output_gate,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$block_size,
    // Qwen3.5's Gated DeltaNet: separate in_proj_qkv, in_proj_z, in_proj_b
    // and in_proj_a instead of Qwen3-Next's fused in_proj_qkvz/in_proj_ba.
    UnitAttr:$split_projections)> {
  let summary = "Linear attention: gated delta rule, Kimi delta, lightning";
  let description = [{
    `kind` is `gated_delta_rule` (S_t = a_t S_{t-1}(I - b_t k_t k_t^T) +
    b_t v_t k_t^T), `kimi_delta` (the same with per-channel decay) or
    `lightning` (decayed linear attention in blocks of `block_size` tokens:
    S_t = exp(-s_h) S_{t-1} + k_t^T v_t, o_t = q_t S_t, with per-head decay
    rates s_h from the head count and the layer index).
  }];
  let hasVerifier = 1;
}

def Adapt_MoEOp : Adapt_ComponentOp<"moe", (ins
    PositiveI64Attr:$num_experts, PositiveI64Attr:$top_k,
    PositiveI64Attr:$expert_intermediate,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$num_shared,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$shared_intermediate,
    StrAttr:$scoring, StrAttr:$activation,
    DefaultValuedAttr<Adapt_RoutingAttr, "::adapt::Routing::ScoreTopK">:$routing,
    DefaultValuedAttr<Adapt_FusedLayoutAttr, "::adapt::FusedLayout::None">:$fused_layout,
    UnitAttr:$shared_gate,
    DefaultValuedAttr<F64Attr, "0.0">:$swiglu_limit,
    DefaultValuedAttr<F64Attr, "1.702">:$swiglu_alpha,
    // Settings (runtime/ModelDef.h, FfnSettings), as adapt.attention's.
    UnitAttr:$norm_topk,
    DefaultValuedAttr<F64Attr, "1.0">:$routed_scaling,
    UnitAttr:$bias_correction,
    DefaultValuedAttr<PositiveI64Attr, "1">:$num_groups,
    DefaultValuedAttr<PositiveI64Attr, "1">:$topk_groups,
    UnitAttr:$router_bias, UnitAttr:$expert_bias)> {
  let summary = "Mixture of experts: router, routed experts, shared experts";
  let description = [{
    y = sum_{e in topk(score(W_r x))} w_e * E_e(x) + S(x), with `scoring`
    softmax or sigmoid, group-limited top-k over `num_groups` groups keeping
    `topk_groups`, optional bias correction of the selection scores, and
    `routed_scaling` on the routed sum.

    `routing`: `score_topk` (score all experts, then top-k), `topk_score`
    (top-k of the logits, then score the k: gpt-oss) or `topk_score_input`
    (the same, the score scaling the expert's input: Llama-4).
    `swiglu_limit` > 0 clamps SwiGLU (gpt-oss, slope `swiglu_alpha`).
    `fused_layout` says how a fused gate_up tensor is stored: `none` for
    per-expert tensors, else one of the FusedLayout enumerators.
  }];
  let hasVerifier = 1;
}

def Adapt_MLPOp : Adapt_ComponentOp<"mlp", (ins
    PositiveI64Attr:$intermediate, StrAttr:$activation)> {
  let summary = "Dense gated MLP";
  let hasVerifier = 1;
}

def Adapt_MTPOp : Adapt_ComponentOp<"mtp", (ins PositiveI64Attr:$depth)> {
  let summary = "Multi-token-prediction module (one extra decoder block)";
}

def Adapt_EncoderOp : Adapt_ComponentOp<"encoder", (ins
    StrAttr:$modality, StrAttr:$encoder_type, PositiveI64Attr:$depth,
    PositiveI64Attr:$width, PositiveI64Attr:$num_heads,
    PositiveI64Attr:$intermediate,
    // What code generation needs to build the vision tower (VisionDef).
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$patch_size,
    DefaultValuedAttr<NonNegativeI64Attr, "1">:$temporal_patch,
    DefaultValuedAttr<NonNegativeI64Attr, "3">:$in_channels,
    DefaultValuedAttr<NonNegativeI64Attr, "1">:$spatial_merge,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$num_positions,
    DefaultValuedAttr<NonNegativeI64Attr, "0">:$out_width,
    OptionalAttr<DenseI64ArrayAttr>:$deepstack_layers,
    DefaultValuedAttr<StrAttr, "\"\"">:$activation,
    DefaultValuedAttr<I64Attr, "-1">:$image_token_id,
    DefaultValuedAttr<F64Attr, "10000.0">:$rope_theta)> {
  let summary = "Encoder of another modality (vision, audio)";
  let description = [{
    Vision (Qwen3-VL): `patch_size` x `patch_size` x `temporal_patch` patches
    of `in_channels`, `num_positions` learned position embeddings,
    `spatial_merge`^2 patches merged into `out_width`, deepstack mergers after
    the blocks in `deepstack_layers`, block MLP `activation`, 2-D RoPE base
    `rope_theta`; merged features replace the `image_token_id` tokens.
  }];
}

def Adapt_LMHeadOp : Adapt_ComponentOp<"lm_head", (ins UnitAttr:$tied)> {
  let summary = "Projection to vocabulary logits";
}

def Adapt_UnmappedOp : Adapt_ComponentOp<"unmapped", (ins
    StrAttr:$domain, StrAttr:$op_type, PositiveI64Attr:$count)> {
  let summary = "An imported operator with no library op (a gap)";
}

def Adapt_GenericComponentOp : Adapt_ComponentOp<"component", (ins
    StrAttr:$kind, PositiveI64Attr:$count)> {
  let summary = "Glue imported from ONNX that maps onto simple library ops";
}

#endif // ADAPT_OPS_TD
