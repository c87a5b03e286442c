// RUN: adapt-opt %s -adapt-inject-lora | FileCheck %s --check-prefix=ALL
// RUN: adapt-opt %s -adapt-inject-lora="targets=q_proj,experts.down_proj rank=4 alpha=8" | FileCheck %s --check-prefix=SOME
// RUN: adapt-opt %s -adapt-inject-lora="targets=experts,shared_experts" | FileCheck %s --check-prefix=EXPERTS
// RUN: adapt-opt %s -adapt-inject-lora="targets=mlp,self_attn.o_proj" | FileCheck %s --check-prefix=MLP
// RUN: adapt-opt %s -adapt-inject-lora="targets=q_proj router=true rslora=true dropout=0.1" 2>&1 | FileCheck %s --check-prefix=ROUTER
// RUN: not adapt-opt %s -adapt-inject-lora="targets=gate" 2>&1 | FileCheck %s --check-prefix=NOROUTER
// RUN: not adapt-opt %s -adapt-inject-lora="targets=q_proj,wq" 2>&1 | FileCheck %s --check-prefix=NOMATCH
// RUN: not adapt-opt %s -adapt-inject-lora="rank=0" 2>&1 | FileCheck %s --check-prefix=RANK

// Tests PEFT-style target selection over a two-layer model: layer 0 has
// attention and a MoE (router, per-expert tensors, shared experts), layer 1
// a dense MLP.

// The default, all-linear: every projection, never the router or lm_head.
// ALL: adapt.model @m attributes {adapt.lora = {adapted = 13 : i64, alpha = 1.600000e+01 : f64, dropout = 0.000000e+00 : f64, modules = [{{.*}}"mlp.experts.gate_up_proj"{{.*}}"self_attn.q_proj"{{.*}}], rank = 8 : i64, router = false, rslora = false, targets = ["all-linear"]}
// ALL: @model.layers.0.self_attn.q_proj.weight : {{.*}}lora = {alpha = 1.600000e+01 : f64, module = "model.layers.0.self_attn.q_proj", rank = 8 : i64}
// ALL: @model.layers.0.self_attn.o_proj.weight : {{.*}}lora = {{.*}}module = "model.layers.0.self_attn.o_proj"
// ALL: @model.layers.0.mlp.gate.weight : tensor<4x16xbf16> {linear, role = "gate"}
// ALL: @"model.layers.0.mlp.experts.{e}.gate_proj.weight" : {{.*}}module = "model.layers.0.mlp.experts.gate_up_proj"
// ALL: @"model.layers.0.mlp.experts.{e}.up_proj.weight" : {{.*}}module = "model.layers.0.mlp.experts.gate_up_proj"
// ALL: @"model.layers.0.mlp.experts.{e}.down_proj.weight" : {{.*}}module = "model.layers.0.mlp.experts.down_proj"
// ALL: @model.layers.0.mlp.shared_experts.down_proj.weight : {{.*}}module = "model.layers.0.mlp.shared_experts.down_proj"
// ALL: @model.layers.1.mlp.up_proj.weight : {{.*}}module = "model.layers.1.mlp.up_proj"
// ALL: @lm_head.weight : tensor<32x16xbf16> {linear, role = "lm_head"}

// Whole components at the end of the path: q_proj, one expert tensor.
// SOME: targets = ["q_proj", "experts.down_proj"]
// SOME: @model.layers.0.self_attn.q_proj.weight : {{.*}}lora = {alpha = 8.000000e+00 : f64, module = "model.layers.0.self_attn.q_proj", rank = 4 : i64}
// SOME: @model.layers.0.self_attn.k_proj.weight : tensor<8x16xbf16> {linear, role = "k_proj"}
// SOME: @"model.layers.0.mlp.experts.{e}.gate_proj.weight" : tensor<4x8x16xbf16> {linear, per_expert, role = "experts.gate_proj", routed}
// SOME: @"model.layers.0.mlp.experts.{e}.down_proj.weight" : {{.*}}lora
// SOME: @model.layers.0.mlp.shared_experts.down_proj.weight : tensor<16x8xbf16> {linear, role = "shared_experts.down_proj"}

// A parent module names its projections: the routed and the shared experts.
// EXPERTS: adapted = 6 : i64
// EXPERTS: @model.layers.0.self_attn.q_proj.weight : tensor<16x16xbf16> {linear, role = "q_proj"}
// EXPERTS: @"model.layers.0.mlp.experts.{e}.gate_proj.weight" : {{.*}}lora
// EXPERTS: @model.layers.0.mlp.shared_experts.gate_proj.weight : {{.*}}lora
// EXPERTS: @model.layers.1.mlp.gate_proj.weight : tensor<32x16xbf16> {linear, role = "gate_proj"}

// "mlp" is the dense MLP only: not the MoE block's router or experts.
// MLP: adapted = 4 : i64
// MLP: @model.layers.0.self_attn.o_proj.weight : {{.*}}lora
// MLP: @model.layers.0.mlp.gate.weight : tensor<4x16xbf16> {linear, role = "gate"}
// MLP: @"model.layers.0.mlp.experts.{e}.gate_proj.weight" : tensor<4x8x16xbf16> {linear, per_expert, role = "experts.gate_proj", routed}
// MLP: @model.layers.1.mlp.gate_proj.weight : {{.*}}lora

// router=true adapts the router too, with a warning.
// ROUTER: warning: adapting 1 MoE router weight(s) (--lora-router): this disturbs the pretrained load balance
// ROUTER: adapt.lora = {adapted = 2 : i64, alpha = 1.600000e+01 : f64, dropout = 1.000000e-01 : f64, modules = ["mlp.gate", "self_attn.q_proj"], rank = 8 : i64, router = true, rslora = true, targets = ["q_proj"]}
// ROUTER: @model.layers.0.mlp.gate.weight : {{.*}}lora = {{.*}}module = "model.layers.0.mlp.gate"

// NOROUTER: error: LoRA target 'gate' matches the MoE router (model.layers.0.mlp.gate); adapting the router disturbs the pretrained load balance, pass --lora-router (pass option router=true) to do it anyway

// NOMATCH: error: LoRA target 'wq' matches no linear module of this model; available: self_attn.q_proj, self_attn.k_proj, self_attn.v_proj, self_attn.o_proj, mlp.gate (router), mlp.experts, mlp.experts.gate_up_proj, mlp.experts.down_proj, mlp.shared_experts, mlp.shared_experts.gate_proj, mlp.shared_experts.up_proj, mlp.shared_experts.down_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj

// RANK: error: LoRA rank must be >= 1, got 0

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
  adapt.weight @model.layers.0.mlp.shared_experts.gate_proj.weight : tensor<8x16xbf16> {role = "shared_experts.gate_proj", linear}
  adapt.weight @model.layers.0.mlp.shared_experts.up_proj.weight : tensor<8x16xbf16> {role = "shared_experts.up_proj", linear}
  adapt.weight @model.layers.0.mlp.shared_experts.down_proj.weight : tensor<16x8xbf16> {role = "shared_experts.down_proj", linear}
  adapt.weight @model.layers.1.mlp.gate_proj.weight : tensor<32x16xbf16> {role = "gate_proj", linear}
  adapt.weight @model.layers.1.mlp.up_proj.weight : tensor<32x16xbf16> {role = "up_proj", linear}
  adapt.weight @model.layers.1.mlp.down_proj.weight : tensor<16x32xbf16> {role = "down_proj", linear}
  adapt.weight @lm_head.weight : tensor<32x16xbf16> {role = "lm_head", linear}
  %x = adapt.embedding %t {weights = [@model.embed_tokens.weight]} : (tensor<?xi64>) -> tensor<?x16xbf16>
  %a = adapt.attention %x {layer = 0 : i64, kind = #adapt.attention_kind<gqa>, num_heads = 2 : i64, num_kv_heads = 1 : i64, head_dim = 8 : i64, v_head_dim = 8 : i64, rope = #adapt.rope<scaling = "default">, weights = [@model.layers.0.self_attn.q_proj.weight, @model.layers.0.self_attn.k_proj.weight, @model.layers.0.self_attn.v_proj.weight, @model.layers.0.self_attn.o_proj.weight]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %m = adapt.moe %a {layer = 0 : i64, num_experts = 4 : i64, top_k = 2 : i64, expert_intermediate = 8 : i64, num_shared = 1 : i64, shared_intermediate = 8 : i64, scoring = "softmax", activation = "silu", weights = [@model.layers.0.mlp.gate.weight, @"model.layers.0.mlp.experts.{e}.gate_proj.weight", @"model.layers.0.mlp.experts.{e}.up_proj.weight", @"model.layers.0.mlp.experts.{e}.down_proj.weight", @model.layers.0.mlp.shared_experts.gate_proj.weight, @model.layers.0.mlp.shared_experts.up_proj.weight, @model.layers.0.mlp.shared_experts.down_proj.weight]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %d = adapt.mlp %m {layer = 1 : i64, intermediate = 32 : i64, activation = "silu", weights = [@model.layers.1.mlp.gate_proj.weight, @model.layers.1.mlp.up_proj.weight, @model.layers.1.mlp.down_proj.weight]} : (tensor<?x16xbf16>) -> tensor<?x16xbf16>
  %l = adapt.lm_head %d {weights = [@lm_head.weight]} : (tensor<?x16xbf16>) -> tensor<?x32xbf16>
  adapt.output %l : tensor<?x32xbf16>
}
