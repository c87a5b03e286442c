// RUN: adapt-opt %s | adapt-opt | FileCheck %s

// Tests that a model with weights, attention, MoE, linear attention and a head round-trips.
// CHECK-LABEL: adapt.model @tiny
// CHECK: adapt.weight @"l0.experts.{e}.w1" : tensor<4x8x16xbf16>
// CHECK: %[[E:.*]] = adapt.embedding %{{.*}} {weights = [@embed]}
// CHECK: %[[A:.*]] = adapt.attention %[[E]]
// CHECK-SAME: kind = #adapt.attention_kind<gqa>
// CHECK-SAME: qk_norm, qk_norm_kind = #adapt.qk_norm_kind<full>
// CHECK-SAME: rope = #adapt.rope<scaling = "yarn", interleaved = true, factor = 4.000000e+01, original_max_positions = 4096, truncate = false>
// CHECK-SAME: window = #adapt.window<sliding>
// CHECK: adapt.add %[[E]], %[[A]]
// CHECK: adapt.moe {{.*}}fused_layout = #adapt.fused_layout<interleaved_in_out>
// CHECK-SAME: routing = #adapt.routing<topk_score>
// CHECK: adapt.linear_attention {{.*}}kind = #adapt.linear_attention_kind<kimi_delta>
// CHECK: adapt.output
adapt.model @tiny attributes {model_type = "t", family = "qwen3_moe", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%tokens: tensor<?xi64>):
  adapt.weight @embed : tensor<32x16xbf16> {role = "embed_tokens"}
  adapt.weight @q : tensor<32x16xbf16> {role = "q_proj", linear}
  adapt.weight @k : tensor<16x16xbf16> {role = "k_proj", linear}
  adapt.weight @v : tensor<16x16xbf16> {role = "v_proj", linear}
  adapt.weight @o : tensor<16x32xbf16> {role = "o_proj", linear}
  adapt.weight @router : tensor<4x16xbf16> {role = "gate", linear}
  adapt.weight @"l0.experts.{e}.w1" : tensor<4x8x16xbf16> {role = "experts.w1", linear, per_expert, routed}
  %x = adapt.embedding %tokens {weights = [@embed]} : (tensor<?xi64>) -> tensor<?x16xbf16>
  %a = adapt.attention %x {kind = #adapt.attention_kind<gqa>, num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, v_head_dim = 8 : i64, rope = #adapt.rope<scaling = "yarn", factor = 40.0, interleaved = true, original_max_positions = 4096, truncate = false>, window = #adapt.window<sliding>, window_size = 4 : i64, qk_norm, qk_norm_kind = #adapt.qk_norm_kind<full>, layer = 0 : i64, weights = [@q, @k, @v, @o]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %h = adapt.add %x, %a : tensor<?x16xbf16>
  %m = adapt.moe %h {num_experts = 4 : i64, top_k = 2 : i64, expert_intermediate = 8 : i64, scoring = "softmax", routing = #adapt.routing<topk_score>, fused_layout = #adapt.fused_layout<interleaved_in_out>, activation = "silu", layer = 0 : i64, weights = [@router, @"l0.experts.{e}.w1"]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %l = adapt.linear_attention %m {kind = #adapt.linear_attention_kind<kimi_delta>, key_heads = 2 : i64, value_heads = 2 : i64, key_head_dim = 8 : i64, value_head_dim = 8 : i64, layer = 0 : i64, weights = []} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %l : tensor<?x16xbf16>
}
