// RUN: adapt-opt %s -adapt-count-parameters | FileCheck %s

// Tests that routed experts count top_k / num_experts of their parameters as
// active and the model gets the totals.
// CHECK: adapt.params = {active = 1344 : i64, decoder = 2112 : i64, embedding = 512 : i64
// CHECK: adapt.moe {{.*}}active_params = 832 : i64{{.*}}params = 1600 : i64
adapt.model @m attributes {model_type = "t", family = "f", hidden = 16 : i64, vocab = 32 : i64} {
^bb0(%t: tensor<?xi64>):
  adapt.weight @embed : tensor<32x16xbf16> {role = "embed_tokens"}
  adapt.weight @router : tensor<4x16xbf16> {role = "gate", linear}
  adapt.weight @"e.{e}" : tensor<4x24x16xbf16> {role = "experts.w1", linear, per_expert, routed}
  %x = adapt.embedding %t {weights = [@embed]} : (tensor<?xi64>) -> tensor<?x16xbf16>
  %m = adapt.moe %x {num_experts = 4 : i64, top_k = 2 : i64, expert_intermediate = 24 : i64, scoring = "softmax", activation = "silu", weights = [@router, @"e.{e}"]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  adapt.output %m : tensor<?x16xbf16>
}
