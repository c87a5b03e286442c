//===- Passes.td - adapt analysis passes -------------------*- tablegen -*-===//
#ifndef ADAPT_PASSES_TD
#define ADAPT_PASSES_TD

include "mlir/Pass/PassBase.td"

//===----------------------------------------------------------------------===//
// Checks of the files
//===----------------------------------------------------------------------===//

def CheckManifestPass : Pass<"adapt-check-manifest", "::adapt::ModelOp"> {
  let summary = "Compare the weights the config implies with the manifest";
  let description = [{
    For every adapt.weight, expands it to its on-disk tensors (per expert,
    with quantization scales) and looks each one up in the manifest:
    missing(w) = disk(w) \ manifest, extra = manifest \ U_w disk(w). Attaches
    `shard` (and `disk_dtype` when shard headers were read) to each weight and
    a summary `adapt.manifest` to the model. When shard headers are present,
    compares shape and dtype tensor by tensor.
  }];
  let options = [
    Option<"manifestPath", "manifest", "std::string", "",
           "model.safetensors.index.json to compare against">,
  ];
}

//===----------------------------------------------------------------------===//
// Accounting and gaps
//===----------------------------------------------------------------------===//

def CountParametersPass : Pass<"adapt-count-parameters", "::adapt::ModelOp"> {
  let summary = "Count total and per-token active parameters per component";
  let description = [{
    params(op) = sum over its weights of numel; active(moe) = params -
    routed + routed * top_k / num_experts; a tied LM head has no parameters
    of its own but is active. Attaches `params` / `active_params` to every
    component and the totals as `adapt.params` on the model.
  }];
}

def GapAnalysisPass : Pass<"adapt-gap-analysis", "::adapt::ModelOp"> {
  let summary = "Match every component against the operator library registry";
  let description = [{
    status(op) = supported if a registry entry for the op covers all its
    features with forward, backward and LoRA; partial if one covers it with
    less; missing otherwise. Attaches `status`, `variant` and `gap_reasons`.
  }];
  let options = [
    Option<"registryPath", "registry", "std::string", "",
           "operator registry JSON (default: the one built in)">,
  ];
}

//===----------------------------------------------------------------------===//
// Training
//===----------------------------------------------------------------------===//

def ApplyPlanPass : Pass<"adapt-apply-plan", "::adapt::ModelOp"> {
  let summary = "Record a parallel layout (adapt plan's choice) on the model";
  let description = [{
    Checks the layout against the model as the runtime will (TP only over
    softmax GQA/MHA attention whose query and key/value heads it divides; EP
    dividing every MoE layer's experts; PP at most the token mixers; CP never
    with DSA sparse attention) and sets `parallel_layout = [tp, ep, pp, cp,
    dp]` and `recompute` on adapt.model. Code generation makes them the
    trainer's default layout (`adapt build --plan plan.json`).
  }];
  let options = [
    Option<"tp", "tp", "int64_t", "1", "tensor-parallel size">,
    Option<"ep", "ep", "int64_t", "1", "expert-parallel size">,
    Option<"pp", "pp", "int64_t", "1", "pipeline stages">,
    Option<"cp", "cp", "int64_t", "1", "context-parallel size">,
    Option<"dp", "dp", "int64_t", "1", "data-parallel size">,
    Option<"recompute", "recompute", "bool", "false", "per-layer recomputation">,
  ];
}

def InjectLoraPass : Pass<"adapt-inject-lora", "::adapt::ModelOp"> {
  let summary = "Mark the linear weights that get LoRA adapters";
  let description = [{
    PEFT-style targets: a pattern matches a linear weight whose Hugging Face
    module path (transformers 5: per-expert tensors belong to the fused
    `mlp.experts.gate_up_proj` / `down_proj`) ends with the pattern's dotted
    components, or whose parent module does (`experts`, `self_attn`, `mlp`).
    `all-linear` (the default) is every attention projection, dense MLP,
    routed and shared expert, never the router, embedding or LM head.
    Routers (`gate`, `router`) need `router=true`, which adapts them all and
    warns. A pattern that matches nothing is an error listing the modules.
    Each chosen adapt.weight gets `lora = {alpha, module, rank}`; the model
    gets `adapt.lora` with every setting and the patterns as given.
  }];
  let options = [
    ListOption<"targets", "targets", "std::string",
               "target patterns (default: all-linear)">,
    Option<"rank", "rank", "int64_t", "8", "adapter rank r">,
    Option<"alpha", "alpha", "double", "16.0", "scaling numerator: alpha / r "
           "(alpha / sqrt(r) with rslora)">,
    Option<"dropout", "dropout", "double", "0.0", "dropout on the adapter input">,
    Option<"rslora", "rslora", "bool", "false", "rank-stabilised scaling">,
    Option<"router", "router", "bool", "false",
           "also adapt the MoE router (disturbs the load balance)">,
  ];
}

#endif // ADAPT_PASSES_TD
