// RUN: adapt-opt %s -adapt-gap-analysis | FileCheck %s

// Tests that every component gets a status from the registry and that a
// variant no entry covers says why.
// CHECK: adapt.attention {{.*}}status = "missing", {{.*}}variant = "attention.gqa.ntk_alpha"
// CHECK: adapt.moe {{.*}}gap_reasons = ["no library op variant covers adapt.moe with {{.*}}scoring=sigmoid{{.*}}swiglu=clamped
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  %x = adapt.embedding %t {weights = []} : (tensor<?xi64>) -> tensor<?x16xbf16>
  %a = adapt.attention %x {kind = #adapt.attention_kind<gqa>, num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64, v_head_dim = 4 : i64, rope = #adapt.rope<scaling = "ntk_alpha">, weights = []} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %m = adapt.moe %a {num_experts = 4 : i64, top_k = 2 : i64, expert_intermediate = 8 : i64, scoring = "sigmoid", swiglu_limit = 7.0, activation = "silu", weights = []} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %m : tensor<?x16xbf16>
}
