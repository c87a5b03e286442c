// RUN: adapt-opt %s -split-input-file -verify-diagnostics

// Tests that a q_proj whose shape disagrees with the head counts is rejected.
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  adapt.weight @q : tensor<24x16xbf16> {role = "q_proj", linear}
  %x = adapt.embedding %t {weights = []} : (tensor<?xi64>) -> tensor<?x16xbf16>
  // expected-error @+1 {{weight 'q_proj' (q) has shape [24, 16] but the op's attributes imply [32, 16]}}
  %a = adapt.attention %x {kind = #adapt.attention_kind<gqa>, num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, v_head_dim = 8 : i64, rope = #adapt.rope<scaling = "default">, weights = [@q]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %a : tensor<?x16xbf16>
}

// -----

// Tests that top_k may not exceed the expert count.
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  %x = adapt.embedding %t {weights = []} : (tensor<?xi64>) -> tensor<?x16xbf16>
  // expected-error @+1 {{top_k (5) exceeds num_experts (4)}}
  %m = adapt.moe %x {num_experts = 4 : i64, top_k = 5 : i64, expert_intermediate = 8 : i64, scoring = "softmax", activation = "silu", weights = []} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %m : tensor<?x16xbf16>
}

// -----

// Tests that a component may only refer to weights of its model.
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  // expected-error @+1 {{refers to @nowhere, which is not an adapt.weight of the model}}
  %x = adapt.embedding %t {weights = [@nowhere]} : (tensor<?xi64>) -> tensor<?x16xbf16>
  adapt.output %x : tensor<?x16xbf16>
}

// -----

// Tests that routed weights must lead with num_experts.
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  adapt.weight @"e.{e}" : tensor<3x8x16xbf16> {role = "experts.w1", linear, per_expert, routed}
  %x = adapt.embedding %t {weights = []} : (tensor<?xi64>) -> tensor<?x16xbf16>
  // expected-error @+1 {{has 3 experts but num_experts is 4}}
  %m = adapt.moe %x {num_experts = 4 : i64, top_k = 2 : i64, expert_intermediate = 8 : i64, scoring = "softmax", activation = "silu", weights = [@"e.{e}"]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %m : tensor<?x16xbf16>
}

// -----

// Tests that ODS rejects an attention kind outside the enumeration.
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  %x = adapt.embedding %t {weights = []} : (tensor<?xi64>) -> tensor<?x16xbf16>
  // expected-error @+2 {{expected ::adapt::AttentionKind to be one of: mha, gqa, mla}}
  // expected-error @+1 {{failed to parse Adapt_AttentionKindAttr parameter 'value'}}
  %a = adapt.attention %x {kind = #adapt.attention_kind<swa>, num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, v_head_dim = 8 : i64, rope = #adapt.rope<scaling = "default">, weights = []} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %a : tensor<?x16xbf16>
}
