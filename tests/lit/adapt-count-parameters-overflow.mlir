// RUN: not adapt-opt %s -adapt-count-parameters 2>&1 | FileCheck %s

// Issue 14: shapes no real model has (each tensor 2^62 elements, summing past
// 2^63) give an error, never a negative parameter count.
// CHECK: error: the parameter count overflows a 64-bit integer
// CHECK-NOT: adapt.params
adapt.model @m attributes {model_type = "t", family = "f", hidden = 1 : i64, vocab = 4611686018427387904 : i64} {
^bb0(%t: tensor<?xi64>):
  adapt.weight @embed : tensor<4611686018427387904x1xbf16> {role = "embed_tokens"}
  adapt.weight @head : tensor<4611686018427387904x1xbf16> {role = "lm_head", linear}
  %x = adapt.embedding %t {weights = [@embed]} : (tensor<?xi64>) -> tensor<?x1xbf16>
  %l = adapt.lm_head %x {weights = [@head]} : (tensor<?x1xbf16>) -> tensor<?x4611686018427387904xbf16>
  adapt.output %l : tensor<?x4611686018427387904xbf16>
}
