//===- Model.h - a decoder assembled from the operator library --*- C++ -*-===//
//
// The runtime's model: built from a ModelDef, base weights loaded from the
// checkpoint's safetensors (frozen, never given gradients), LoRA adapters
// created for the targets the ModelDef names. The trainer only sees this
// interface.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_MODEL_H
#define ADAPT_RUNTIME_MODEL_H

#include "runtime/Distributed.h"
#include "runtime/ModelDef.h"
#include "runtime/Vision.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace adapt::rt {

/// Where and in which precision the model lives.
struct ModelOptions {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32; ///< Base weights and activations.
  uint64_t seed = 0;                         ///< LoRA A initialisation.
  /// Keep only each decoder layer's input during a training forward and
  /// recompute the layer in the backward pass (runtime/Recompute.h): about
  /// one more forward of compute for activation memory that no longer grows
  /// with the layer count times the layer's intermediates. Not used while
  /// activations are captured (validation).
  bool recomputeLayers = false;
  /// The routed experts' node (GPU, FusedExperts.h) keeps its tokens and
  /// narrow [rows, r] factors instead of its gathered rows and SwiGLU
  /// output, and rebuilds those two in the backward pass: ~40 KB less per
  /// token and MoE layer at Qwen3-30B-A3B's widths, for one more row gather
  /// and SwiGLU pass per layer. Same values and gradients.
  bool recomputeExpertInputs = false;
  /// Called while loading: (tensors done, tensors in all). May be empty.
  std::function<void(int64_t, int64_t)> progress;
  /// A parallel run (runtime/Distributed.h): with ep > 1 this rank loads and
  /// trains only its share of every MoE layer's routed experts. Null: alone.
  std::shared_ptr<Distributed> distributed;
  /// Pipeline parallelism (pp + 1 layer boundaries, runtime/ModelCost.h's
  /// pipelineBoundaries): this rank loads and runs only its stage's layers.
  /// Empty: every layer.
  std::vector<int64_t> pipelineBounds;
};

/// How an adapter tensor is split between the ranks of an expert-parallel
/// group (each holds E / ep experts' factors, in PEFT's layout).
enum class AdapterShard {
  None,          ///< Whole on every rank.
  ExpertRows,    ///< Rows e*r+k (lora_A): the local experts' rows, in order.
  ExpertColumns, ///< Columns k*E+e (lora_B): [out, r*E_local], column k*E_local+e.
  TensorRows,    ///< Tensor parallelism: this rank's rows (B of a column-parallel layer).
  TensorColumns, ///< Tensor parallelism: this rank's columns (A of a row-parallel layer).
};

/// One trainable adapter tensor with the key PEFT's adapter_model.safetensors
/// uses for it ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
struct AdapterTensor {
  std::string peftKey;
  torch::Tensor value; ///< requires_grad; fp32 master copy.
  AdapterShard shard = AdapterShard::None;
  int64_t rank = 0;    ///< LoRA rank r, for ExpertColumns.
  /// Whole on every TP rank but each holds only its part of the gradient
  /// (A of a column-parallel layer, B of a row-parallel one): summed over the
  /// tensor-parallel group before the step.
  bool tensorPartial = false;
  /// False on a pipeline stage that does not run this module: the value is
  /// kept (every stage draws every factor, so every layout starts alike, and
  /// checkpoints are assembled from the stages that own each tensor) but it
  /// gets no gradient and no optimizer state here.
  bool local = true;
};

/// Per decoder layer, how many tokens each routed expert received in the last
/// forward (empty for dense layers).
using ExpertLoad = std::vector<std::vector<int64_t>>;

class ModelImpl;

/// A decoder-only model, frozen base weights plus LoRA adapters.
class Model {
public:
  /// Builds \p def and loads its base weights from \p modelDir (config.json's
  /// folder). Throws adapt::rt::LoadError naming the file and tensor on a
  /// missing or mismatched tensor.
  Model(const ModelDef &def, const std::string &modelDir, const ModelOptions &options);
  ~Model();
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  /// Logits [B, T, vocab] (fp32) for token ids [B, T] (int64).
  torch::Tensor logits(const torch::Tensor &ids);
  /// Mean next-token cross-entropy: position t predicts ids[t+1]; labels
  /// equal to -100 are ignored. A scalar with a graph back to the adapters.
  torch::Tensor loss(const torch::Tensor &ids, const torch::Tensor &labels);
  /// logits() and loss() for a batch with images (ModelDef.vision): the
  /// vision tower's features replace the image placeholder tokens, deepstack
  /// features join the first text layers, image tokens get M-RoPE positions.
  /// Empty \p images: the text-only forward. Throws BadInput when the model
  /// has no vision tower or the tokens do not match the images.
  torch::Tensor logits(const torch::Tensor &ids, const ImageInput &images);
  torch::Tensor loss(const torch::Tensor &ids, const torch::Tensor &labels, const ImageInput &images);
  /// The sum (not the mean) of the text-only next-token cross-entropies:
  /// a parallel run divides it by the global batch's target count.
  torch::Tensor lossSum(const torch::Tensor &ids, const torch::Tensor &labels);
  /// The summed next-token cross-entropy of an eval forward: dropout off,
  /// as the trainer's eval loss (call it under torch::NoGradGuard).
  torch::Tensor evalLossSum(const torch::Tensor &ids, const torch::Tensor &labels, const ImageInput &images);

  /// Pipeline parallelism: this stage's part of a training forward. The
  /// first stage takes token ids [B, T], the others the previous stage's
  /// output [B, T, hidden]; the last stage's output is final-normed.
  torch::Tensor stageForward(const torch::Tensor &input);
  /// The summed next-token cross-entropy of final-normed hidden states
  /// (the last stage's stageForward output) against \p labels [B, T]
  /// (position t predicts labels[t+1]; the last position nothing) or
  /// [B, T+1] (context parallelism: the next part's first label too).
  torch::Tensor lossSumOfHidden(const torch::Tensor &hidden, const torch::Tensor &labels);
  /// The decoder layers [first, end) this rank runs (all of them alone).
  std::pair<int64_t, int64_t> stageLayers() const;

  /// Every adapter tensor, in a fixed order (layer, module, A before B).
  std::vector<AdapterTensor> adapters() const;
  /// The adapter_config.json PEFT needs to load adapters() (as a JSON text).
  std::string peftConfigJson(const std::string &baseModelPath) const;
  /// Base tensors with the adapters folded in, under their checkpoint names
  /// (per-expert names split back out), for `merge`. CPU, checkpoint dtype.
  std::vector<std::pair<std::string, torch::Tensor>> mergedWeights() const;
  /// Token counts per routed expert from the last forward, or summed over
  /// the forwards since the last sumExpertLoad() call.
  ExpertLoad expertLoad() const;
  /// Starts summing expert load over the next forwards (a training step's
  /// micro-batches or pipeline passes); the trainer calls it every step.
  void sumExpertLoad();
  /// The per-layer expert-load counters expertLoad() reads (undefined for
  /// dense layers), and setting them back: a captured step (StepGraph)
  /// writes its own, which another forward (an eval) must not replace.
  std::vector<torch::Tensor> loadTensors() const;
  void setLoadTensors(std::vector<torch::Tensor> counters);
  /// Forced routing for the next forwards: every MoE layer sends its tokens to
  /// \p experts[block path] ([B*T, k] int64, e.g. what the reference chose;
  /// block path = the router module's parent, "model.layers.3.mlp") with the
  /// weights its own scores give them. A MoE layer without an entry is a
  /// BadInput (exit 2). A sparse-attention layer's indexer takes the keys
  /// \p experts[indexer path] ([B, T, min(top_k, T)] int64 key positions,
  /// "model.layers.1.self_attn.indexer") where given, else chooses its own.
  /// Empty: the routers and indexers choose again.
  void forceRouting(std::map<std::string, torch::Tensor> experts);
  /// Tokens, summed over layers, that the last forward's routers would have
  /// sent to other experts than the forced ones (0 without forcing).
  int64_t routingFlips() const;
  /// Per MoE layer and routed expert: tokens in the last forward and the norm
  /// of the expert's adapter gradient (both fused tensors), after backward.
  struct ExpertGradient {
    int64_t layer = 0, expert = 0, tokens = 0;
    double gradNorm = 0.0;
  };
  std::vector<ExpertGradient> expertGradients() const;
  /// Records, during the next forwards, every layer's attention output, FFN
  /// output and layer output as "layers.<i>.attention|ffn|output" into
  /// \p sink (null stops): how validation names the first divergence.
  void captureActivations(std::vector<std::pair<std::string, torch::Tensor>> *sink);
  /// Forward FLOPs per token (matmuls, attention at \p seqLen), for MFU.
  double flopsPerToken(int64_t seqLen) const;
  const ModelDef &def() const;
  const ModelOptions &modelOptions() const;

private:
  std::unique_ptr<ModelImpl> impl;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_MODEL_H
