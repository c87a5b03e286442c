//===- LoraTargets.h - which linear weights a LoRA pattern names -*- C++ -*-===//
//
// LoRA targets are given the way PEFT takes them: patterns over the Hugging
// Face (transformers 5) module paths. A checkpoint weight maps to the module
// that holds it there: per-expert tensors ("experts.{e}.w1.weight") belong to
// the fused "mlp.experts.gate_up_proj", Mixtral's "block_sparse_moe" is
// "mlp". A pattern matches when its dotted components equal the last
// components of a module path, or of the module's parent (so "experts",
// "self_attn" and "mlp" name whole blocks); '*' matches inside a component.
// Routers never match through the FFN block. Plain C++: shared by the
// adapt-inject-lora pass, code generation and the unit tests.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_MODELS_LORATARGETS_H
#define ADAPT_MODELS_LORATARGETS_H

#include <optional>
#include <string>
#include <vector>

namespace adapt {

/// What a linear weight is part of.
enum class LoraModuleKind {
  Attention,     ///< Token-mixer projections (q/k/v/o, MLA's, linear attention's).
  Mlp,           ///< Dense gated MLP.
  Experts,       ///< Routed experts (fused gate_up and down).
  SharedExperts, ///< The shared expert MLP.
  Router,        ///< The MoE router, and Qwen's shared-expert gate.
  Vision,        ///< Vision-tower block projections: only when a pattern names them.
  NoGradient,    ///< The sparse-attention indexer: it only selects keys and runs
                 ///< without autograd (as in transformers), so an adapter there
                 ///< would never train; naming it is an error.
  Other,         ///< Anything else.
};

/// A linear weight as PEFT sees it.
struct LoraModule {
  std::string path;      ///< "model.layers.0.mlp.experts.gate_up_proj"
  std::string local;     ///< Relative to the layer: "mlp.experts.gate_up_proj"
  std::string container; ///< Parent module; "" for a router directly under the FFN.
  LoraModuleKind kind = LoraModuleKind::Other;
};

/// The checkpoint prefix of a decoder layer's tensors ("model.layers.3."),
/// "" when \p name is under no "layers.N.".
std::string layerPrefixOf(const std::string &name);

/// The FFN module of a layer in transformers: "feed_forward." (Llama-4) or
/// "mlp." (every other family, Mixtral's block_sparse_moe included).
std::string hfFfnModule(const std::string &family);

/// The module holding the linear weight \p name (role \p role) of a
/// component (\p component: attention, mla, sparse_attention,
/// linear_attention, mlp or moe); nullopt for weights LoRA never targets.
std::optional<LoraModule> loraModuleOf(const std::string &component,
                                       const std::string &role,
                                       const std::string &name,
                                       const std::string &family);

/// PEFT-style suffix match on whole dotted components, '*' within one.
bool matchesModulePattern(const std::string &pattern, const std::string &path);

/// Whether \p pattern selects \p module (not "all-linear").
bool patternSelects(const std::string &pattern, const LoraModule &module);

/// The outcome of matching target patterns against a model's modules.
struct LoraSelection {
  std::vector<bool> selected; ///< Parallel to the modules.
  int64_t routers = 0;        ///< Selected router modules.
  std::string error;          ///< Non-empty: the targets are invalid.
};

/// Applies \p patterns (empty: "all-linear") to \p modules. "all-linear" is
/// every attention projection, dense MLP, routed and shared expert, never a
/// router. A pattern that selects a router without \p router, or selects
/// nothing, is an error. With \p router every router is adapted.
LoraSelection selectLoraTargets(const std::vector<LoraModule> &modules,
                                const std::vector<std::string> &patterns,
                                bool router);

} // namespace adapt

#endif // ADAPT_MODELS_LORATARGETS_H
