// RUN: adapt-opt %s -adapt-apply-plan="ep=2 dp=4 recompute=true" | FileCheck %s --check-prefix=OK
// RUN: not adapt-opt %s -adapt-apply-plan="ep=3" 2>&1 | FileCheck %s --check-prefix=EP
// RUN: not adapt-opt %s -adapt-apply-plan="tp=2" 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not adapt-opt %s -adapt-apply-plan="pp=3" 2>&1 | FileCheck %s --check-prefix=PP
// RUN: not adapt-opt %s -adapt-apply-plan="dp=0" 2>&1 | FileCheck %s --check-prefix=ZERO

// adapt build --plan: the layout is checked against the model with the
// runtime's rules and recorded on adapt.model for code generation. One GQA
// layer (2 query heads, 1 key/value head) with 4 experts, one dense layer.

// OK: adapt.model @m attributes {family = "qwen3_moe", hidden = 16 : i64, model_type = "t", parallel_layout = array<i64: 1, 2, 1, 1, 4>, recompute, vocab = 32 : i64}

// EP: error: EP 3 must divide the 4 routed experts
// TP: error: TP 2 must divide the 2 query and 1 key/value heads
// PP: error: PP 3 exceeds the 1 decoder layers
// ZERO: error: parallel sizes must be >= 1

adapt.model @m attributes {model_type = "t", family = "qwen3_moe", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  adapt.weight @model.embed_tokens.weight : tensor<32x16xbf16> {role = "embed_tokens"}
  adapt.weight @model.layers.0.self_attn.q_proj.weight : tensor<16x16xbf16> {role = "q_proj", linear}
  adapt.weight @model.layers.0.self_attn.k_proj.weight : tensor<8x16xbf16> {role = "k_proj", linear}
  adapt.weight @model.layers.0.self_attn.v_proj.weight : tensor<8x16xbf16> {role = "v_proj", linear}
  adapt.weight @model.layers.0.self_attn.o_proj.weight : tensor<16x16xbf16> {role = "o_proj", linear}
  adapt.weight @model.layers.0.mlp.gate.weight : tensor<4x16xbf16> {role = "gate", linear}
  adapt.weight @"model.layers.0.mlp.experts.{e}.gate_proj.weight" : tensor<4x8x16xbf16> {role = "experts.gate_proj", linear, per_expert, routed}
  adapt.weight @"model.layers.0.mlp.experts.{e}.up_proj.weight" : tensor<4x8x16xbf16> {role = "experts.up_proj", linear, per_expert, routed}
  adapt.weight @"model.layers.0.mlp.experts.{e}.down_proj.weight" : tensor<4x16x8xbf16> {role = "experts.down_proj", linear, per_expert, routed}
  adapt.weight @model.layers.1.mlp.gate_proj.weight : tensor<32x16xbf16> {role = "gate_proj", linear}
  adapt.weight @model.layers.1.mlp.up_proj.weight : tensor<32x16xbf16> {role = "up_proj", linear}
  adapt.weight @model.layers.1.mlp.down_proj.weight : tensor<16x32xbf16> {role = "down_proj", linear}
  adapt.weight @lm_head.weight : tensor<32x16xbf16> {role = "lm_head", linear}
  %x = adapt.embedding %t {weights = [@model.embed_tokens.weight]} : (tensor<?xi64>) -> tensor<?x16xbf16>
  %a = adapt.attention %x {layer = 0 : i64, kind = #adapt.attention_kind<gqa>, num_heads = 2 : i64, num_kv_heads = 1 : i64, head_dim = 8 : i64, v_head_dim = 8 : i64, rope = #adapt.rope<scaling = "default">, weights = [@model.layers.0.self_attn.q_proj.weight, @model.layers.0.self_attn.k_proj.weight, @model.layers.0.self_attn.v_proj.weight, @model.layers.0.self_attn.o_proj.weight]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %m = adapt.moe %a {layer = 0 : i64, num_experts = 4 : i64, top_k = 2 : i64, expert_intermediate = 8 : i64, scoring = "softmax", activation = "silu", weights = [@model.layers.0.mlp.gate.weight, @"model.layers.0.mlp.experts.{e}.gate_proj.weight", @"model.layers.0.mlp.experts.{e}.up_proj.weight", @"model.layers.0.mlp.experts.{e}.down_proj.weight"]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %d = adapt.mlp %m {layer = 1 : i64, intermediate = 32 : i64, activation = "silu", weights = [@model.layers.1.mlp.gate_proj.weight, @model.layers.1.mlp.up_proj.weight, @model.layers.1.mlp.down_proj.weight]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %l = adapt.lm_head %d {weights = [@lm_head.weight]} : (tensor<?x16xbf16>) -> tensor<?x32xbf16>
  adapt.output %l : tensor<?x32xbf16>
}
