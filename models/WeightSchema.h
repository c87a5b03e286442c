//===- WeightSchema.h - the tensors a config implies ------------*- C++ -*-===//
//
// Architecture knowledge: for a normalised ModelSpec, every component with
// the checkpoint's own tensor names and logical shapes. The IR importer puts
// these into the `adapt` dialect; parameter accounting and the manifest check
// read them from there. Names follow the family's Hugging Face layout; where
// a family has several layouts (fused or split projections, the name prefix
// of a multimodal release) the manifest decides through a NameProbe.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_MODELS_WEIGHTSCHEMA_H
#define ADAPT_MODELS_WEIGHTSCHEMA_H

#include "parser/ModelSpec.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace adapt {

/// One weight tensor of a component (or one per expert).
struct WeightDecl {
  std::string role;           ///< Short role inside the component: "q_proj".
  std::string name;           ///< Checkpoint name; "{e}" = expert number.
  std::vector<int64_t> shape; ///< Logical shape; fused expert tensors lead with E.
  int64_t experts = 0;        ///< >0 with "{e}": one tensor per expert.
  bool linear = false;        ///< A matmul weight [out, in]: LoRA target, quantizable.
  bool routed = false;        ///< Belongs to routed experts (active topK/E).
};

/// One model component: what becomes one op of the dialect.
struct ComponentDecl {
  std::string kind;  ///< embedding|norm|attention|mla|gated_delta_net|kimi_delta|
                     ///< lightning|moe|mlp|lm_head|mtp|vision_encoder|audio_encoder
  int64_t layer = -1;               ///< Decoder layer, -1 when global.
  std::vector<WeightDecl> weights;
};

/// Answers whether the manifest names a tensor; null when there is none.
using NameProbe = std::function<bool(const std::string &)>;

/// Turns on features the config leaves implicit but the manifest's tensor
/// names show (QK-norm in Qwen3). Recognition by tensors, not by name.
void refineWithManifest(ModelSpec &spec, const NameProbe &probe);

/// Declares every component and weight of \p spec. \p probe, when given,
/// picks between the family's alternative layouts.
std::vector<ComponentDecl> declareModel(const ModelSpec &spec,
                                        const NameProbe &probe = nullptr);

/// Number of elements of one declared tensor (all experts included).
int64_t weightElements(const WeightDecl &weight);

/// A tensor as stored on disk, after quantization.
struct DiskTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype; ///< safetensors dtype name.
};

/// The on-disk tensors of \p weight of expert \p expert (ignored when the
/// weight is not per-expert), given the checkpoint's quantization.
void expandToDisk(const WeightDecl &weight, int64_t expert,
                  const QuantSpec &quant, const std::string &dtype,
                  std::vector<DiskTensor> &out);

/// The safetensors dtype of unquantized weights for a config's torch dtype.
std::string safetensorsDtypeFor(const std::string &torchDtype);

} // namespace adapt

#endif // ADAPT_MODELS_WEIGHTSCHEMA_H
