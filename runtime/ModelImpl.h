//===- ModelImpl.h - the model's private state ------------------*- C++ -*-===//
//
// Model's implementation, shared by the two files that define it: Model.cpp
// (the forward pass, adapters, routing) and ModelBuild.cpp (loading the
// checkpoint into layers, tensor- and expert-parallel slicing, LoRA
// injection). A private header: only runtime/Model*.cpp include it.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_MODELIMPL_H
#define ADAPT_RUNTIME_MODELIMPL_H

#include "runtime/Model.h"

#include "runtime/Errors.h"
#include "runtime/FileSystem.h"
#include "runtime/Layers.h"
#include "runtime/LightningLayer.h"
#include "runtime/LinearAttention.h"
#include "runtime/LinearLayers.h"
#include "runtime/Recompute.h"
#include "runtime/SafetensorsIO.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace adapt::rt {

/// A batch's images spliced into the text: where the image tokens are, the
/// deepstack features to add there, and the tokens' M-RoPE positions.
struct ImageSplice {
  torch::Tensor rows;                   ///< Flat (b * T + t) indices of image tokens.
  std::vector<torch::Tensor> deepstack; ///< Added after text layer k.
  torch::Tensor positions;              ///< [3, B, T]; undefined without images.
};

/// One decoder layer's modules.
struct Layer {
  torch::Tensor inputNorm, postAttentionNorm;
  AttentionLayer attention;
  GatedDeltaNetLayer deltaNet;   ///< Used instead of attention for AttentionKind::GatedDeltaNet.
  bool isDeltaNet = false;
  LightningLayer lightning;      ///< Used instead of attention for AttentionKind::Lightning.
  bool isLightning = false;
  KimiDeltaLayer kimiDelta;      ///< Used instead of attention for AttentionKind::KimiDelta.
  bool isKimiDelta = false;
  FfnLayer ffn;

  /// Every linear of the layer a LoRA adapter can attach to (not the routed
  /// experts), in one order: the adapters', the merged export's and
  /// injection's (which draws the adapters' initial values in it).
  template <typename L, typename Self> static std::vector<L *> linearsOf(Self &self) {
    std::vector<L *> all = self.attention.linears();
    for (const auto &part : {self.ffn.linears(), self.lightning.linears(), self.kimiDelta.linears(),
                             self.deltaNet.linears()})
      all.insert(all.end(), part.begin(), part.end());
    return all;
  }
  std::vector<LoraLinear *> linears() { return linearsOf<LoraLinear>(*this); }
  std::vector<const LoraLinear *> linears() const { return linearsOf<const LoraLinear>(*this); }
};

/// MiniMax's scaled residual alpha * residual + beta * update; a plain sum
/// when both are 1 (every other family), so their numerics are untouched.
inline torch::Tensor scaledResidual(const torch::Tensor &residual, const torch::Tensor &update, double alpha, double beta) {
  if (alpha == 1.0 && beta == 1.0)
    return residual + update;
  return residual * alpha + update * beta;
}

/// Whether two layers rotate identically (and so can share RoPE tables).
inline bool sameRope(const RopeDef &a, const RopeDef &b) {
  return a.enabled == b.enabled && a.rotaryDim == b.rotaryDim && a.theta == b.theta &&
         a.interleaved == b.interleaved && a.scaling == b.scaling && a.factor == b.factor &&
         a.originalMaxPositions == b.originalMaxPositions && a.betaFast == b.betaFast &&
         a.betaSlow == b.betaSlow && a.mscale == b.mscale && a.mscaleAllDim == b.mscaleAllDim &&
         a.truncate == b.truncate && a.lowFreqFactor == b.lowFreqFactor && a.highFreqFactor == b.highFreqFactor &&
         a.mropeSection == b.mropeSection;
}

inline std::string expertName(const std::string &pattern, int64_t e) {
  std::string out = pattern;
  size_t at = out.find("{e}");
  if (at != std::string::npos)
    out.replace(at, 3, std::to_string(e));
  return out;
}

class ModelImpl {
public:
  ModelDef def;
  ModelOptions options;
  std::string modelDir;
  std::unique_ptr<CheckpointReader> reader;
  torch::Tensor embedding, finalNorm, lmHead;
  std::vector<Layer> layers;
  std::vector<torch::Tensor> lastLoad;
  /// Model::forceRouting's experts by MoE block path, and the flips per layer.
  std::map<std::string, torch::Tensor> forcedRouting;
  std::vector<torch::Tensor> lastFlips; ///< Per layer, int64 scalars on the device.
  int64_t loaded = 0, toLoad = 0;
  std::vector<std::pair<std::string, torch::Tensor>> *capture = nullptr;
  /// Per layer, the first layer with the same RoPE: whose tables it shares.
  std::vector<size_t> ropeOwner;
  /// RoPE tables by (owner layer, first position, length, device): made
  /// once, since their frequencies start on the CPU, and a copy to the GPU
  /// inside a captured step (StepGraph) is not allowed. Cleared when full.
  std::map<std::tuple<size_t, int64_t, int64_t, std::string>, RopeTables> ropeCache;

  /// The text RoPE tables of ropeOwner \p owner for positions [first, first + count).
  const RopeTables &cachedRope(size_t owner, int64_t first, int64_t count, torch::Device device) {
    auto key = std::make_tuple(owner, first, count, device.str());
    auto it = ropeCache.find(key);
    if (it == ropeCache.end()) {
      if (ropeCache.size() >= 64)
        ropeCache.clear();
      it = ropeCache.emplace(key, ropeTablesAt(layers[owner].attention.def.rope, first, count, device)).first;
    }
    return it->second;
  }
  torch::Generator generator;
  std::unique_ptr<VisionTower> vision; ///< Qwen3-VL image encoder (ModelDef.vision).
  /// Pipeline parallelism: this rank's stage runs layers [firstLayer,
  /// endLayer); the first stage also embeds (and holds the vision tower), the
  /// last applies the final norm and the LM head. Alone: every layer.
  size_t firstLayer = 0, endLayer = 0;
  bool firstStage = true, lastStage = true;
  /// While building another stage's part: load() reads nothing and returns
  /// a meta tensor of the shape, so that part's LoRA factors are still drawn
  /// (every layout starts from the same adapter) without its weights.
  bool skipping = false;
  /// Context parallelism: which part of every sequence this rank holds.
  ContextSplit context;
  /// Expert load summed over forwards (a step's micro-batches) rather than
  /// the last forward's (Model::sumExpertLoad).
  bool summingLoad = false;

  ModelImpl(const ModelDef &d, const std::string &dir, const ModelOptions &o)
      : def(d), options(o), modelDir(dir) {
    reader = std::make_unique<CheckpointReader>(dir);
    generator = at::detail::createCPUGenerator(o.seed);
    toLoad = countTensors();
    if (o.distributed && o.distributed->layout().cp > 1)
      context = {&o.distributed->context(), o.distributed->contextRank(), o.distributed->layout().cp};
    endLayer = def.layers.size();
    if (!o.pipelineBounds.empty()) {
      const int64_t stage = o.distributed->pipelineRank();
      firstLayer = o.pipelineBounds[stage];
      endLayer = o.pipelineBounds[stage + 1];
      firstStage = stage == 0;
      lastStage = stage + 1 == o.distributed->layout().pp;
    }
    const bool tied = def.tieEmbeddings || def.lmHead.empty();
    skipping = !firstStage && !(lastStage && tied);
    embedding = load(def.embedding, {def.vocab, def.hidden});
    skipping = !lastStage;
    finalNorm = load(def.finalNorm, {def.hidden});
    lmHead = tied ? embedding : load(def.lmHead, {def.vocab, def.hidden});
    for (size_t i = 0; i < def.layers.size(); ++i) {
      skipping = i < firstLayer || i >= endLayer;
      layers.push_back(buildLayer(def.layers[i]));
    }
    skipping = !firstStage;
    if (def.vision.enabled())
      vision = std::make_unique<VisionTower>(
          def.vision, [this](const std::string &name, std::vector<int64_t> shape) { return load(name, shape); });
    skipping = false;
    lastLoad.resize(layers.size());
    lastFlips.resize(layers.size());
    for (size_t i = 0; i < def.layers.size(); ++i) {
      size_t owner = i;
      for (size_t j = 0; j < i && owner == i; ++j)
        if (sameRope(def.layers[j].attention.rope, def.layers[i].attention.rope))
          owner = j;
      ropeOwner.push_back(owner);
    }
  }

  /// Tensors the loader will read, for the progress callback.
  int64_t countTensors() const {
    int64_t n = def.tieEmbeddings || def.lmHead.empty() ? 2 : 3;
    n += VisionTower::tensorCount(def.vision);
    for (const LayerDef &l : def.layers) {
      n += 2 + l.attention.weights.size();
      for (const auto &[role, name] : l.ffn.weights)
        n += name.find("{e}") != std::string::npos ? localExperts(l.ffn.experts) : 1;
    }
    return n;
  }

  void progress() {
    ++loaded;
    if (options.progress)
      options.progress(std::min(loaded, toLoad), toLoad);
  }

  /// Loads \p name converted to the model dtype (or \p dtype), checking its
  /// shape when \p shape is given.
  torch::Tensor load(const std::string &name, std::vector<int64_t> shape,
                     std::optional<torch::ScalarType> dtype = std::nullopt) {
    if (skipping) {
      progress();
      return torch::empty(shape.empty() ? reader->info(name).shape : shape,
                          torch::TensorOptions().dtype(dtype.value_or(options.dtype)).device(torch::kMeta));
    }
    torch::Tensor t = reader->load(name, dtype.value_or(options.dtype));
    if (!shape.empty() && t.sizes().vec() != shape)
      throw LoadError(modelDir, name,
                      "expected shape " + formatShape(shape) + " from config.json, found " + formatShape(t.sizes()));
    progress();
    return t.to(options.device);
  }

  const std::string &name(const std::map<std::string, std::string> &weights, const std::string &role,
                          const LayerDef &layer) const {
    auto it = weights.find(role);
    if (it == weights.end())
      throw LoadError(modelDir, "layer " + std::to_string(layer.index) + " " + role,
                      "expected the generated model to name this weight (regenerate with adapt build)");
    return it->second;
  }

  std::optional<std::string> optionalName(const std::map<std::string, std::string> &weights,
                                          std::initializer_list<const char *> roles) const {
    for (const char *r : roles) {
      auto it = weights.find(r);
      if (it != weights.end())
        return it->second;
    }
    return std::nullopt;
  }

  /// The module path in the HF model for a checkpoint weight of \p layer.
  std::string hfPath(const LayerDef &layer, const std::string &checkpointName) const;

  LoraLinear linear(const LayerDef &layer, const std::map<std::string, std::string> &weights, const std::string &role, int64_t out, int64_t in, bool bias, std::optional<torch::ScalarType> dtype = std::nullopt);

  Layer buildLayer(const LayerDef &l);

  /// MiniMax's lightning attention: weights by role (qkv_proj, output_gate,
  /// norm, out_proj); the decay slopes follow from the layer index.
  void buildLightning(const LayerDef &l, LightningLayer &g);

  /// Kimi-Linear's delta attention: weights by role (q/k/v_proj, their
  /// q/k/v_conv1d, f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, A_log,
  /// dt_bias, o_norm, o_proj).
  void buildKimiDelta(const LayerDef &l, KimiDeltaLayer &g);

  /// Qwen3-Next's Gated DeltaNet: weights by role (in_proj_qkvz, in_proj_ba,
  /// conv1d, A_log, dt_bias, norm, out_proj).
  void buildGatedDeltaNet(const LayerDef &l, GatedDeltaNetLayer &g);

  /// SparseMla's lightning indexer (runtime/SparseAttention.h); weights_proj
  /// in fp32 as transformers keeps it.
  void buildSparseIndexer(const LayerDef &l, AttentionLayer &a);

  void buildAttention(const LayerDef &l, AttentionLayer &a);

  /// This rank's 1/tp of \p t along \p dim, whose first \p width entries are
  /// split (tp equal consecutive parts).
  torch::Tensor tensorSlice(const torch::Tensor &t, int64_t dim, int64_t width) const;

  /// A depthwise convolution [C, 1, K] over channels made of consecutive
  /// blocks (q, k, v), each split by heads: this rank's rows of each block.
  torch::Tensor convolutionSlice(const torch::Tensor &conv, std::initializer_list<int64_t> blocks) const;

  /// Tensor parallelism: the group size (1 when not split) and this rank's index.
  int64_t tensorParallel() const;

  /// Keeps this rank's output rows of \p l (column-parallel: q, k, v, gate, up).
  void splitColumns(LoraLinear &l);

  /// Keeps this rank's input columns of \p l (row-parallel: o, down).
  void splitRows(LoraLinear &l);

  /// Expert parallelism: the routed experts of a layer with \p experts that
  /// this rank holds (all of them when not split).
  int64_t localExperts(int64_t experts) const;

  int64_t firstLocalExpert(int64_t experts) const;

  /// This rank's experts of the fused [E, ...] tensor \p name (shape \p shape
  /// checked whole first): only their bytes are read (loadRows).
  torch::Tensor loadLocalExperts(const std::string &name, std::vector<int64_t> shape);

  /// Loads this rank's per-expert tensors "{e}" stacked to [E_local, rows, cols]
  /// (the other experts' tensors are never read).
  torch::Tensor stackExperts(const std::string &pattern, int64_t experts, int64_t rows, int64_t cols);

  void buildFfn(const LayerDef &l, FfnLayer &f);

  // -- LoRA ---------------------------------------------------------------
  /// Whether the module at \p path (in layer \p layer) gets an adapter: one
  /// of the modules adapt-inject-lora resolved the user's targets to.
  bool targeted(const std::string &path, const LayerDef &layer) const;

  double loraScale() const;

  /// Kaiming-uniform(a=sqrt(5)) on [rows, fanIn], as PEFT initialises lora_A.
  torch::Tensor initA(int64_t rows, int64_t fanIn);

  void addLora(LoraLinear &l);

  /// Expert LoRA kept in PEFT's file layout: A [E*r, in], B [out, r*E]; with
  /// split experts, the local experts' rows of A (drawn for all E, so every
  /// layout starts from the same adapter) and a B of r*E_local columns.
  void addLora(ExpertLinear &x, int64_t allExperts);

  void injectLora();

  // -- forward -------------------------------------------------------------

  /// Runs the vision tower and puts its features into the embeddings \p x.
  ImageSplice spliceImages(const torch::Tensor &ids, const ImageInput &images, torch::Tensor &x, bool training);

  torch::Tensor hidden(const torch::Tensor &ids, bool training, const ImageInput *images = nullptr) {
    torch::Tensor x = torch::embedding(embedding, ids.to(options.device));
    // Images: merged features replace the placeholder tokens' embeddings;
    // deepstack features are added after the first text layers.
    ImageSplice splice;
    if (images && !images->empty())
      splice = spliceImages(ids, *images, x, training);
    return norm(runLayers(x, 0, layers.size(), training, splice), finalNorm);
  }

  /// Layers [first, end) on hidden states \p x [B, T, hidden].
  torch::Tensor runLayers(torch::Tensor x, size_t first, size_t end, bool training, const ImageSplice &splice) {
    const int64_t seqLen = x.size(1);
    // One table per distinct RoPE (by the layer that first uses it).
    std::map<size_t, RopeTables> tables;
    const RopeTables none;
    for (size_t i = first; i < end; ++i) {
      Layer &layer = layers[i];
      const RopeDef &rope = layer.attention.def.rope;
      auto it = tables.find(ropeOwner[i]);
      if (it == tables.end() && rope.rotaryDim > 0)
        it = tables
                 .emplace(ropeOwner[i], splice.positions.defined() && !rope.mropeSection.empty()
                                            ? mropeTables(rope, splice.positions, x.device())
                                            : cachedRope(ropeOwner[i], context.offset(seqLen), seqLen, x.device()))
                 .first;
      if (it != tables.end() && !it->second.positions.defined())
        it->second.positions = splice.positions; // For a generated rotary operator.
      // The layer as a function of its input; with recomputation it runs
      // again in the backward pass, after this function has returned, so it
      // holds its RoPE tables by value.
      const LayerDef &ld = def.layers[i];
      torch::Tensor attn, ffn; // for capture only
      const bool keep = capture != nullptr;
      RecomputedFunction body = [this, &layer, &ld, i, training, keep, &attn, &ffn,
                                 t = it == tables.end() ? none : it->second](const torch::Tensor &in) {
        // The plain stream (h = in + a) passes through residualRmsNorm, which
        // on the GPU fuses the add into the norm and the stream's gradient
        // into the norm's backward; scaled or normed residuals compose.
        const bool plainStream =
            !ld.normedResidual && ld.attentionResidualAlpha == 1.0 && ld.attentionResidualBeta == 1.0;
        auto [stream, normed] = plainStream
                                    ? residualRmsNorm(in, {}, layer.inputNorm, def.normEps, def.normWeightOffset)
                                    : std::pair(in, norm(in, layer.inputNorm));
        torch::Tensor a = layer.isDeltaNet    ? layer.deltaNet.forward(normed, training)
                          : layer.isLightning ? layer.lightning.forward(normed, training)
                          : layer.isKimiDelta ? layer.kimiDelta.forward(normed, training)
                                              : layer.attention.forward(normed, t, training);
        torch::Tensor h, ffnIn;
        if (plainStream) {
          std::tie(h, ffnIn) = residualRmsNorm(stream, a, layer.postAttentionNorm, def.normEps, def.normWeightOffset);
        } else {
          h = scaledResidual(ld.normedResidual ? normed : in, a, ld.attentionResidualAlpha, ld.attentionResidualBeta);
          ffnIn = norm(h, layer.postAttentionNorm);
        }
        torch::Tensor load;
        torch::Tensor forced;
        if (!forcedRouting.empty() && layer.ffn.isMoe()) {
          auto found = forcedRouting.find(layer.ffn.blockPath());
          if (found == forcedRouting.end())
            throw badInput("", "--force-routing", "expected experts for " + layer.ffn.blockPath());
          forced = found->second;
        }
        torch::Tensor f = layer.ffn.forward(ffnIn, training, &load, forced, &lastFlips[i]);
        if (summingLoad && lastLoad[i].defined() && load.defined())
          lastLoad[i] = lastLoad[i] + load.detach();
        else
          lastLoad[i] = load.defined() ? load.detach() : torch::Tensor();
        if (keep)
          attn = a, ffn = f;
        return scaledResidual(ld.normedResidual ? ffnIn : h, f, ld.ffnResidualAlpha, ld.ffnResidualBeta);
      };
      x = options.recomputeLayers && training && !keep ? recompute(body, x) : body(x);
      if (capture) {
        std::string prefix = "layers." + std::to_string(i) + ".";
        capture->push_back({prefix + "attention", attn.detach()});
        capture->push_back({prefix + "ffn", ffn.detach()});
        capture->push_back({prefix + "output", x.detach()});
      }
      if (i < splice.deepstack.size())
        x = x.flatten(0, 1).index_add(0, splice.rows, splice.deepstack[i].to(x.scalar_type())).view_as(x);
    }
    return x;
  }

  /// The decoder's RMSNorm: zero-centred (scale 1 + weight) when the model says so.
  torch::Tensor norm(const torch::Tensor &x, const torch::Tensor &weight) const {
    return def.normWeightOffset ? zeroCentredRmsNorm(x, weight, def.normEps) : rmsNorm(x, weight, def.normEps);
  }
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_MODELIMPL_H
