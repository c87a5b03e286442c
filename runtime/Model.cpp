//===- Model.cpp - a decoder assembled from the operator library ----------===//

#include "runtime/Model.h"
#include "runtime/ModelCost.h"
#include "runtime/Recompute.h"

#include "runtime/Errors.h"
#include "runtime/FileSystem.h"
#include "runtime/Json.h"
#include "runtime/Layers.h"
#include "runtime/LightningLayer.h"
#include "runtime/LinearAttention.h"
#include "runtime/LinearCrossEntropy.h"
#include "runtime/LinearLayers.h"
#include "runtime/SafetensorsIO.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

namespace adapt::rt {

namespace {

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
};

/// MiniMax's scaled residual alpha * residual + beta * update; a plain sum
/// when both are 1 (every other family), so their numerics are untouched.
torch::Tensor scaledResidual(const torch::Tensor &residual, const torch::Tensor &update, double alpha, double beta) {
  if (alpha == 1.0 && beta == 1.0)
    return residual + update;
  return residual * alpha + update * beta;
}

/// Whether two layers rotate identically (and so can share RoPE tables).
bool sameRope(const RopeDef &a, const RopeDef &b) {
  return a.enabled == b.enabled && a.rotaryDim == b.rotaryDim && a.theta == b.theta &&
         a.interleaved == b.interleaved && a.scaling == b.scaling && a.factor == b.factor &&
         a.originalMaxPositions == b.originalMaxPositions && a.betaFast == b.betaFast &&
         a.betaSlow == b.betaSlow && a.mscale == b.mscale && a.mscaleAllDim == b.mscaleAllDim &&
         a.truncate == b.truncate && a.lowFreqFactor == b.lowFreqFactor && a.highFreqFactor == b.highFreqFactor &&
         a.mropeSection == b.mropeSection;
}

std::string expertName(const std::string &pattern, int64_t e) {
  std::string out = pattern;
  size_t at = out.find("{e}");
  if (at != std::string::npos)
    out.replace(at, 3, std::to_string(e));
  return out;
}

} // namespace

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
  std::string hfPath(const LayerDef &layer, const std::string &checkpointName) const {
    std::string layerPrefix = layer.inputNorm.substr(0, layer.inputNorm.size() - std::string("input_layernorm.weight").size());
    std::string rel = checkpointName.substr(layerPrefix.size());
    for (const char *suffix : {".weight", ".bias"})
      if (endsWith(rel, suffix))
        rel = rel.substr(0, rel.size() - std::strlen(suffix));
    for (const char *module : {"block_sparse_moe.", "feed_forward.", "mlp."})
      if (rel.rfind(module, 0) == 0)
        rel = layer.hfFfn + rel.substr(std::strlen(module));
    return layer.hfPrefix + rel;
  }

  LoraLinear linear(const LayerDef &layer, const std::map<std::string, std::string> &weights,
                    const std::string &role, int64_t out, int64_t in, bool bias,
                    std::optional<torch::ScalarType> dtype = std::nullopt) {
    LoraLinear l;
    l.checkpointName = name(weights, role, layer);
    l.weight = load(l.checkpointName, {out, in}, dtype);
    if (bias) {
      auto b = optionalName(weights, {(role + ".bias").c_str()});
      if (!b)
        throw LoadError(modelDir, "layer " + std::to_string(layer.index) + " " + role + ".bias",
                        "expected a bias name for this projection");
      l.bias = load(*b, {out}, dtype);
    }
    l.hfPath = hfPath(layer, l.checkpointName);
    return l;
  }

  Layer buildLayer(const LayerDef &l) {
    Layer layer;
    layer.inputNorm = load(l.inputNorm, {def.hidden});
    layer.postAttentionNorm = load(l.postAttentionNorm, {def.hidden});
    layer.isDeltaNet = l.attention.kind == AttentionKind::GatedDeltaNet;
    layer.isLightning = l.attention.kind == AttentionKind::Lightning;
    layer.isKimiDelta = l.attention.kind == AttentionKind::KimiDelta;
    if (layer.isDeltaNet)
      buildGatedDeltaNet(l, layer.deltaNet);
    else if (layer.isKimiDelta)
      buildKimiDelta(l, layer.kimiDelta);
    else if (layer.isLightning)
      buildLightning(l, layer.lightning);
    else
      buildAttention(l, layer.attention);
    buildFfn(l, layer.ffn);
    layer.attention.context = layer.deltaNet.context = layer.kimiDelta.context = layer.lightning.context = context;
    layer.deltaNet.layerIndex = layer.kimiDelta.layerIndex = layer.lightning.layerIndex = l.index;
    return layer;
  }

  /// MiniMax's lightning attention: weights by role (qkv_proj, output_gate,
  /// norm, out_proj); the decay slopes follow from the layer index.
  void buildLightning(const LayerDef &l, LightningLayer &g) {
    const LinearAttentionDef &d = l.attention.linear;
    const auto &w = l.attention.weights;
    g.def = d;
    g.setLayer(l.index);
    const int64_t h = def.hidden, width = d.keyHeads * d.keyHeadDim;
    g.qkvProj = linear(l, w, "qkv_proj", 3 * width, h, false);
    g.outputGate = linear(l, w, "output_gate", width, h, false);
    g.norm = load(name(w, "norm", l), {width});
    g.outProj = linear(l, w, "out_proj", h, width, false);
    if (const int64_t tp = tensorParallel(); tp > 1) {
      // Whole heads per rank (qkv_proj keeps [q, k, v] per head); the output
      // norm spans every head, so its statistics are summed over the group.
      splitColumns(g.qkvProj);
      splitColumns(g.outputGate);
      splitRows(g.outProj);
      g.norm = tensorSlice(g.norm, 0, width);
      g.slopes = tensorSlice(g.slopes, 0, d.keyHeads);
      g.def.keyHeads /= tp;
      g.def.valueHeads /= tp;
      g.tensorGroup = &options.distributed->tensor();
    }
    g.slopes = g.slopes.to(options.device);
  }

  /// Kimi-Linear's delta attention: weights by role (q/k/v_proj, their
  /// q/k/v_conv1d, f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, A_log,
  /// dt_bias, o_norm, o_proj).
  void buildKimiDelta(const LayerDef &l, KimiDeltaLayer &g) {
    const LinearAttentionDef &d = l.attention.linear;
    const auto &w = l.attention.weights;
    if (d.keyHeads <= 0 || d.keyHeadDim <= 0 || d.convKernel <= 0)
      throw LoadError(modelDir, "layer " + std::to_string(l.index) + " linear attention",
                      "expected heads, a head width and a convolution width (regenerate with adapt build)");
    const int64_t h = def.hidden, heads = d.keyHeads, dim = d.keyHeadDim, width = heads * dim;
    g.def = d;
    g.normEps = def.normEps;
    g.q = linear(l, w, "q_proj", width, h, false);
    g.k = linear(l, w, "k_proj", width, h, false);
    g.v = linear(l, w, "v_proj", width, h, false);
    g.conv = torch::cat({load(name(w, "q_conv1d", l), {width, 1, d.convKernel}),
                         load(name(w, "k_conv1d", l), {width, 1, d.convKernel}),
                         load(name(w, "v_conv1d", l), {width, 1, d.convKernel})});
    g.fA = linear(l, w, "f_a_proj", dim, h, false);
    g.fB = linear(l, w, "f_b_proj", width, dim, false);
    g.b = linear(l, w, "b_proj", heads, h, false);
    g.gA = linear(l, w, "g_a_proj", dim, h, false);
    g.gB = linear(l, w, "g_b_proj", width, dim, false);
    g.aLog = load(name(w, "A_log", l), {1, 1, heads, 1}, torch::kFloat32).view({heads});
    g.dtBias = load(name(w, "dt_bias", l), {width});
    g.norm = load(name(w, "o_norm", l), {dim});
    g.o = linear(l, w, "o_proj", h, width, false);
    // transformers keeps f_a/f_b in a forget_gate submodule: PEFT's paths.
    for (LoraLinear *f : {&g.fA, &g.fB}) {
      size_t at = f->hfPath.rfind(".f_");
      if (at != std::string::npos)
        f->hfPath.insert(at + 1, "forget_gate.");
    }
    if (const int64_t tp = tensorParallel(); tp > 1) {
      // Whole heads per rank; f_a and g_a (rank-d bottlenecks) stay whole.
      for (LoraLinear *column : {&g.q, &g.k, &g.v, &g.fB, &g.b, &g.gB})
        splitColumns(*column);
      splitRows(g.o);
      g.conv = convolutionSlice(g.conv, {width, width, width});
      g.aLog = tensorSlice(g.aLog, 0, heads);
      g.dtBias = tensorSlice(g.dtBias, 0, width);
      g.def.keyHeads /= tp;
      g.def.valueHeads /= tp;
    }
  }

  /// Qwen3-Next's Gated DeltaNet: weights by role (in_proj_qkvz, in_proj_ba,
  /// conv1d, A_log, dt_bias, norm, out_proj).
  void buildGatedDeltaNet(const LayerDef &l, GatedDeltaNetLayer &g) {
    const LinearAttentionDef &d = l.attention.linear;
    const auto &w = l.attention.weights;
    if (d.keyHeads <= 0 || d.valueHeads <= 0 || d.valueHeads % d.keyHeads != 0 || d.convKernel <= 0)
      throw LoadError(modelDir, "layer " + std::to_string(l.index) + " linear attention",
                      "expected value heads a multiple of key heads and a convolution width (regenerate with adapt build)");
    const int64_t h = def.hidden, keyDim = d.keyHeads * d.keyHeadDim, valueDim = d.valueHeads * d.valueHeadDim;
    g.def = d;
    g.normEps = def.normEps;
    g.inProjQkvz = linear(l, w, "in_proj_qkvz", 2 * keyDim + 2 * valueDim, h, false);
    g.inProjBa = linear(l, w, "in_proj_ba", 2 * d.valueHeads, h, false);
    g.conv = load(name(w, "conv1d", l), {2 * keyDim + valueDim, 1, d.convKernel});
    g.aLog = load(name(w, "A_log", l), {d.valueHeads}, torch::kFloat32);
    g.dtBias = load(name(w, "dt_bias", l), {d.valueHeads});
    g.norm = load(name(w, "norm", l), {d.valueHeadDim});
    g.outProj = linear(l, w, "out_proj", h, valueDim, false);
    if (const int64_t tp = tensorParallel(); tp > 1) {
      // Whole key-head groups per rank (in_proj_qkvz and in_proj_ba keep one
      // block per key head), their value heads with them.
      splitColumns(g.inProjQkvz);
      splitColumns(g.inProjBa);
      splitRows(g.outProj);
      g.conv = convolutionSlice(g.conv, {keyDim, keyDim, valueDim});
      g.aLog = tensorSlice(g.aLog, 0, d.valueHeads);
      g.dtBias = tensorSlice(g.dtBias, 0, d.valueHeads);
      g.def.keyHeads /= tp;
      g.def.valueHeads /= tp;
    }
  }

  /// SparseMla's lightning indexer (runtime/SparseAttention.h); weights_proj
  /// in fp32 as transformers keeps it.
  void buildSparseIndexer(const LayerDef &l, AttentionLayer &a) {
    const AttentionDef &d = l.attention;
    const SparseIndexerDef &ix = d.indexer;
    const auto &w = d.weights;
    if (d.qLoraRank <= 0 || ix.heads <= 0 || ix.headDim <= d.qkRopeDim || ix.topK <= 0)
      throw LoadError(modelDir, "layer " + std::to_string(l.index) + " indexer",
                      "expected q_lora_rank > 0, index heads > 0, index_head_dim > qk_rope_head_dim and top_k > 0 "
                      "(regenerate with adapt build)");
    a.indexQ = linear(l, w, "indexer.wq_b", ix.heads * ix.headDim, d.qLoraRank, false);
    a.indexK = linear(l, w, "indexer.wk", ix.headDim, def.hidden, false);
    a.indexKNorm = load(name(w, "indexer.k_norm", l), {ix.headDim});
    a.indexKNormBias = load(name(w, "indexer.k_norm.bias", l), {ix.headDim});
    a.indexWeights = linear(l, w, "indexer.weights_proj", ix.heads, def.hidden, false, torch::kFloat32);
  }

  void buildAttention(const LayerDef &l, AttentionLayer &a) {
    const AttentionDef &d = l.attention;
    const auto &w = d.weights;
    a.def = d;
    a.normEps = def.normEps;
    a.zeroCentredNorms = def.normWeightOffset;
    const int64_t h = def.hidden;
    if (d.kind == AttentionKind::Mla || d.kind == AttentionKind::SparseMla) {
      const int64_t qHead = d.qkNopeDim + d.qkRopeDim;
      if (d.qLoraRank > 0) {
        a.qA = linear(l, w, "q_a_proj", d.qLoraRank, h, false);
        a.qANorm = load(name(w, "q_a_layernorm", l), {d.qLoraRank});
        a.qB = linear(l, w, "q_b_proj", d.heads * qHead, d.qLoraRank, false);
      } else {
        a.q = linear(l, w, "q_proj", d.heads * qHead, h, false);
      }
      a.kvA = linear(l, w, "kv_a_proj_with_mqa", d.kvLoraRank + d.qkRopeDim, h, false);
      a.kvANorm = load(name(w, "kv_a_layernorm", l), {d.kvLoraRank});
      a.kvB = linear(l, w, "kv_b_proj", d.heads * (d.qkNopeDim + d.vHeadDim), d.kvLoraRank, false);
      a.o = linear(l, w, "o_proj", h, d.heads * d.vHeadDim, d.outBias);
      if (d.kind == AttentionKind::SparseMla)
        buildSparseIndexer(l, a); // Replicated: frozen, it only selects keys.
      if (const int64_t tp = tensorParallel(); tp > 1) {
        // Whole heads per rank: q (or q_b) and kv_b by their output rows, o
        // by its input columns. q_a and kv_a feed every head and stay whole;
        // what they share reaches each rank's heads through copy regions.
        splitColumns(d.qLoraRank > 0 ? a.qB : a.q);
        splitColumns(a.kvB);
        splitRows(a.o);
        a.def.heads /= tp;
        if (a.def.kvHeads > 0)
          a.def.kvHeads /= tp;
        a.tensorGroup = &options.distributed->tensor();
      }
    } else {
      a.q = linear(l, w, "q_proj", d.heads * d.headDim * (d.outputGate ? 2 : 1), h, d.qkvBias);
      a.k = linear(l, w, "k_proj", d.kvHeads * d.headDim, h, d.qkvBias);
      a.v = linear(l, w, "v_proj", d.kvHeads * d.vHeadDim, h, d.qkvBias);
      a.o = linear(l, w, "o_proj", h, d.heads * d.vHeadDim, d.outBias);
      if (d.qkNorm == "head" || d.qkNorm == "full") {
        bool full = d.qkNorm == "full";
        a.qNorm = load(name(w, "q_norm", l), {full ? d.heads * d.headDim : d.headDim});
        a.kNorm = load(name(w, "k_norm", l), {full ? d.kvHeads * d.headDim : d.headDim});
      }
      if (d.sinks)
        a.sinks = load(name(w, "sinks", l), {d.heads}, torch::kFloat32);
      if (const int64_t tp = tensorParallel(); tp > 1) { // Whole heads per rank.
        for (LoraLinear *column : {&a.q, &a.k, &a.v})
          splitColumns(*column);
        splitRows(a.o);
        if (a.sinks.defined())
          a.sinks = a.sinks.narrow(0, options.distributed->tensorRank() * (d.heads / tp), d.heads / tp).contiguous();
        if (d.qkNorm == "full") { // This rank's heads' part of the full-width norms.
          a.qNorm = tensorSlice(a.qNorm, 0, d.heads * d.headDim);
          a.kNorm = tensorSlice(a.kNorm, 0, d.kvHeads * d.headDim);
        }
        a.def.heads /= tp;
        a.def.kvHeads /= tp;
        a.tensorGroup = &options.distributed->tensor();
      }
    }
  }

  /// This rank's 1/tp of \p t along \p dim, whose first \p width entries are
  /// split (tp equal consecutive parts).
  torch::Tensor tensorSlice(const torch::Tensor &t, int64_t dim, int64_t width) const {
    const int64_t part = width / tensorParallel();
    return t.narrow(dim, options.distributed->tensorRank() * part, part).contiguous();
  }
  /// A depthwise convolution [C, 1, K] over channels made of consecutive
  /// blocks (q, k, v), each split by heads: this rank's rows of each block.
  torch::Tensor convolutionSlice(const torch::Tensor &conv, std::initializer_list<int64_t> blocks) const {
    std::vector<torch::Tensor> parts;
    int64_t start = 0;
    for (int64_t width : blocks) {
      parts.push_back(tensorSlice(conv.narrow(0, start, width), 0, width));
      start += width;
    }
    return torch::cat(parts).contiguous();
  }

  /// Tensor parallelism: the group size (1 when not split) and this rank's index.
  int64_t tensorParallel() const {
    const auto &dist = options.distributed;
    return dist ? dist->layout().tp : 1;
  }
  /// Keeps this rank's output rows of \p l (column-parallel: q, k, v, gate, up).
  void splitColumns(LoraLinear &l) {
    const int64_t tp = tensorParallel();
    if (tp == 1 || !l.weight.defined())
      return;
    const int64_t rows = l.weight.size(0) / tp, first = options.distributed->tensorRank() * rows;
    l.weight = l.weight.narrow(0, first, rows).contiguous();
    if (l.bias.defined())
      l.bias = l.bias.narrow(0, first, rows).contiguous();
    l.split = TensorSplit::Columns;
    l.tensorGroup = &options.distributed->tensor();
  }
  /// Keeps this rank's input columns of \p l (row-parallel: o, down).
  void splitRows(LoraLinear &l) {
    const int64_t tp = tensorParallel();
    if (tp == 1 || !l.weight.defined())
      return;
    const int64_t cols = l.weight.size(1) / tp;
    l.weight = l.weight.narrow(1, options.distributed->tensorRank() * cols, cols).contiguous();
    l.split = TensorSplit::Rows;
    l.tensorGroup = &options.distributed->tensor();
  }

  /// Expert parallelism: the routed experts of a layer with \p experts that
  /// this rank holds (all of them when not split).
  int64_t localExperts(int64_t experts) const {
    const auto &dist = options.distributed;
    return dist && dist->layout().ep > 1 ? experts / dist->layout().ep : experts;
  }
  int64_t firstLocalExpert(int64_t experts) const {
    const auto &dist = options.distributed;
    return dist && dist->layout().ep > 1 ? dist->expertRank() * localExperts(experts) : 0;
  }
  /// This rank's experts of the fused [E, ...] tensor \p name (shape \p shape
  /// checked whole first): only their bytes are read (loadRows).
  torch::Tensor loadLocalExperts(const std::string &name, std::vector<int64_t> shape) {
    const int64_t experts = shape[0];
    if (localExperts(experts) == experts)
      return load(name, shape);
    if (skipping) {
      shape[0] = localExperts(experts);
      return load(name, shape);
    }
    std::vector<int64_t> stored = reader->info(name).shape;
    if (stored != shape)
      throw LoadError(modelDir, name,
                      "expected shape " + formatShape(shape) + " from config.json, found " + formatShape(stored));
    torch::Tensor t = reader->loadRows(name, options.dtype, firstLocalExpert(experts), localExperts(experts));
    progress();
    return t.to(options.device);
  }

  /// Loads this rank's per-expert tensors "{e}" stacked to [E_local, rows, cols]
  /// (the other experts' tensors are never read).
  torch::Tensor stackExperts(const std::string &pattern, int64_t experts, int64_t rows, int64_t cols) {
    std::vector<torch::Tensor> parts;
    const int64_t first = firstLocalExpert(experts);
    for (int64_t e = first; e < first + localExperts(experts); ++e)
      parts.push_back(load(expertName(pattern, e), {rows, cols}));
    return torch::stack(parts);
  }

  void buildFfn(const LayerDef &l, FfnLayer &f) {
    const FfnDef &d = l.ffn;
    const auto &w = d.weights;
    const int64_t h = def.hidden, width = d.intermediate, e = d.experts;
    f.def = d;
    if (e == 0) {
      f.gate = linear(l, w, "gate_proj", width, h, false);
      f.up = linear(l, w, "up_proj", width, h, false);
      f.down = linear(l, w, "down_proj", h, width, false);
      splitColumns(f.gate);
      splitColumns(f.up);
      splitRows(f.down);
      return;
    }
    f.router = linear(l, w, "router", e, h, d.routerBias, torch::kFloat32);
    if (d.correctionBias)
      f.correctionBias = load(name(w, "correction_bias", l), {e}, torch::kFloat32);
    std::string experts = l.hfPrefix + l.hfFfn + "experts";
    f.gateUp.hfParam = experts + ".gate_up_proj";
    f.expertDown.hfParam = experts + ".down_proj";
    f.interleavedGateUp = d.fusedLayout == "interleaved_in_out";
    f.gateUp.peftSwapped = f.expertDown.peftSwapped = d.fusedLayout == "concat_in_out";
    if (d.fusedLayout.empty()) {
      torch::Tensor gate = stackExperts(name(w, "gate_proj", l), e, width, h);
      torch::Tensor up = stackExperts(name(w, "up_proj", l), e, width, h);
      f.gateUp.weight = torch::cat({gate, up}, 1).contiguous();
      f.expertDown.weight = stackExperts(name(w, "down_proj", l), e, h, width);
    } else if (d.fusedLayout == "concat_out_in") {
      f.gateUp.weight = loadLocalExperts(name(w, "gate_up_proj", l), {e, 2 * width, h});
      f.expertDown.weight = loadLocalExperts(name(w, "down_proj", l), {e, h, width});
    } else {
      // [E, in, out] on disk (gpt-oss, Llama-4): keep [E, out, in] in memory.
      f.gateUp.weight = loadLocalExperts(name(w, "gate_up_proj", l), {e, h, 2 * width}).transpose(1, 2).contiguous();
      f.expertDown.weight = loadLocalExperts(name(w, "down_proj", l), {e, width, h}).transpose(1, 2).contiguous();
    }
    if (localExperts(e) != e) {
      f.shard.group = &options.distributed->expert();
      f.shard.first = firstLocalExpert(e);
      f.shard.local = localExperts(e);
    }
    if (d.expertBias) {
      auto gb = optionalName(w, {"gate_up_proj.bias", "gate_up_proj_bias"});
      auto db = optionalName(w, {"down_proj.bias", "down_proj_bias"});
      if (!gb || !db)
        throw LoadError(modelDir, "layer " + std::to_string(l.index) + " expert biases",
                        "expected gate_up_proj_bias and down_proj_bias names");
      f.gateUp.bias = loadLocalExperts(*gb, {e, 2 * width});
      f.expertDown.bias = loadLocalExperts(*db, {e, h});
    }
    if (d.sharedIntermediate > 0) {
      f.sharedGate = linear(l, w, "shared.gate_proj", d.sharedIntermediate, h, false);
      f.sharedUp = linear(l, w, "shared.up_proj", d.sharedIntermediate, h, false);
      f.sharedDown = linear(l, w, "shared.down_proj", h, d.sharedIntermediate, false);
      if (d.sharedGate)
        f.sharedExpertGate = linear(l, w, "shared_gate", 1, h, false);
      splitColumns(f.sharedGate);
      splitColumns(f.sharedUp);
      splitRows(f.sharedDown);
    }
  }

  // -- LoRA ---------------------------------------------------------------

  /// Whether the module at \p path (in layer \p layer) gets an adapter: one
  /// of the modules adapt-inject-lora resolved the user's targets to.
  bool targeted(const std::string &path, const LayerDef &layer) const {
    std::string local = path.substr(std::min(path.size(), layer.hfPrefix.size()));
    const auto &modules = def.lora.modules;
    return std::find(modules.begin(), modules.end(), local) != modules.end();
  }

  double loraScale() const {
    const double r = static_cast<double>(def.lora.rank);
    return def.lora.rslora ? def.lora.alpha / std::sqrt(r) : def.lora.alpha / r;
  }

  /// Kaiming-uniform(a=sqrt(5)) on [rows, fanIn], as PEFT initialises lora_A.
  torch::Tensor initA(int64_t rows, int64_t fanIn) {
    double bound = 1.0 / std::sqrt(static_cast<double>(fanIn));
    torch::Tensor a = torch::empty({rows, fanIn}, torch::kFloat32);
    a.uniform_(-bound, bound, generator);
    return a.to(options.device).requires_grad_(true);
  }

  void addLora(LoraLinear &l) {
    if (!l.weight.defined())
      return;
    const int64_t r = def.lora.rank;
    if (l.split == TensorSplit::Rows) { // Drawn whole, so every layout starts alike.
      const int64_t cols = l.weight.size(1);
      l.loraA = initA(r, cols * tensorParallel())
                    .detach()
                    .narrow(1, options.distributed->tensorRank() * cols, cols)
                    .clone()
                    .requires_grad_(true);
    } else {
      l.loraA = initA(r, l.weight.size(1));
    }
    l.loraB = torch::zeros({l.weight.size(0), r}, torch::TensorOptions().dtype(torch::kFloat32).device(options.device))
                  .requires_grad_(true);
    l.scale = loraScale();
    l.dropout = def.lora.dropout;
  }

  /// Expert LoRA kept in PEFT's file layout: A [E*r, in], B [out, r*E]; with
  /// split experts, the local experts' rows of A (drawn for all E, so every
  /// layout starts from the same adapter) and a B of r*E_local columns.
  void addLora(ExpertLinear &x, int64_t allExperts) {
    int64_t e = x.weight.size(0), out = x.weight.size(1), in = x.weight.size(2), r = def.lora.rank;
    if (x.peftSwapped)
      std::swap(out, in);
    x.loraA = initA(allExperts * r, in);
    if (e != allExperts)
      x.loraA = x.loraA.detach().narrow(0, firstLocalExpert(allExperts) * r, e * r).clone().requires_grad_(true);
    x.loraB = torch::zeros({out, r * e}, torch::TensorOptions().dtype(torch::kFloat32).device(options.device))
                  .requires_grad_(true);
    x.scale = loraScale();
  }

  void injectLora() {
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerDef &d = def.layers[i];
      AttentionLayer &a = layers[i].attention;
      FfnLayer &f = layers[i].ffn;
      for (LoraLinear *l : {&a.q, &a.k, &a.v, &a.o, &a.qA, &a.qB, &a.kvA, &a.kvB, &a.indexQ, &a.indexK, &a.indexWeights, &f.gate, &f.up, &f.down,
                            &f.sharedGate, &f.sharedUp, &f.sharedDown, &f.router, &f.sharedExpertGate})
        if (l->weight.defined() && targeted(l->hfPath, d))
          addLora(*l);
      for (LoraLinear *l : layers[i].deltaNet.linears())
        if (l->weight.defined() && targeted(l->hfPath, d))
          addLora(*l);
      for (LoraLinear *l : layers[i].lightning.linears())
        if (l->weight.defined() && targeted(l->hfPath, d))
          addLora(*l);
      for (LoraLinear *l : layers[i].kimiDelta.linears())
        if (l->weight.defined() && targeted(l->hfPath, d))
          addLora(*l);
      if (f.isMoe())
        for (ExpertLinear *x : {&f.gateUp, &f.expertDown})
          if (targeted(x->hfParam, d))
            addLora(*x, f.def.experts);
    }
    // Vision blocks: only the modules named (attn.qkv, attn.proj, mlp.linear_fc1/2).
    if (vision)
      for (auto &[local, l] : vision->adaptable())
        if (std::find(def.lora.modules.begin(), def.lora.modules.end(), local) != def.lora.modules.end())
          addLora(*l);
  }

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
        torch::Tensor normed = norm(in, layer.inputNorm);
        torch::Tensor a = layer.isDeltaNet    ? layer.deltaNet.forward(normed, training)
                          : layer.isLightning ? layer.lightning.forward(normed, training)
                          : layer.isKimiDelta ? layer.kimiDelta.forward(normed, training)
                                              : layer.attention.forward(normed, t, training);
        torch::Tensor h = scaledResidual(ld.normedResidual ? normed : in, a, ld.attentionResidualAlpha,
                                         ld.attentionResidualBeta);
        torch::Tensor load;
        torch::Tensor ffnIn = norm(h, layer.postAttentionNorm);
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

ImageSplice ModelImpl::spliceImages(const torch::Tensor &ids, const ImageInput &images, torch::Tensor &x,
                                     bool training) {
  if (!vision)
    throw badInput("batch", "images", "expected a model with a vision tower (ModelDef.vision) for a batch with images");
  const VisionDef &vd = def.vision;
  VisionOutput features = vision->forward(images, training);
  torch::Tensor mask = ids.to(x.device()) == vd.imageTokenId; // [B, T]
  ImageSplice s;
  s.rows = mask.flatten().nonzero().squeeze(1);
  if (s.rows.size(0) != features.merged.size(0))
    throw badInput("batch", "input_ids",
                   "expected one image token (id " + std::to_string(vd.imageTokenId) + ") per merged image feature: " +
                       std::to_string(features.merged.size(0)) + " features, " + std::to_string(s.rows.size(0)) +
                       " tokens");
  x = x.flatten(0, 1).index_copy(0, s.rows, features.merged.to(x.scalar_type())).view_as(x);
  s.deepstack = std::move(features.deepstack);
  s.positions = mropePositions(ids, images.gridThw, vd.imageTokenId, vd.spatialMerge);
  if (capture) {
    capture->push_back({"vision.merged", features.merged.detach()});
    for (size_t k = 0; k < s.deepstack.size(); ++k)
      capture->push_back({"vision.deepstack." + std::to_string(k), s.deepstack[k].detach()});
  }
  return s;
}

Model::Model(const ModelDef &def, const std::string &modelDir, const ModelOptions &options)
    : impl(std::make_unique<ModelImpl>(def, modelDir, options)) {
  impl->injectLora();
}

Model::~Model() = default;

const ModelDef &Model::def() const { return impl->def; }

const ModelOptions &Model::modelOptions() const { return impl->options; }

torch::Tensor Model::logits(const torch::Tensor &ids) { return logits(ids, ImageInput{}); }

torch::Tensor Model::logits(const torch::Tensor &ids, const ImageInput &images) {
  torch::Tensor h = impl->hidden(ids, /*training=*/false, &images);
  return torch::linear(h, impl->lmHead).to(torch::kFloat32);
}

torch::Tensor Model::loss(const torch::Tensor &ids, const torch::Tensor &labels) {
  return loss(ids, labels, ImageInput{});
}

torch::Tensor Model::loss(const torch::Tensor &ids, const torch::Tensor &labels, const ImageInput &images) {
  torch::Tensor h = impl->hidden(ids, /*training=*/true, &images);
  torch::Tensor targets = labels.to(h.device()).narrow(1, 1, ids.size(1) - 1);
  // The mean over the targets that count, as cross_entropy's ignore_index.
  return lossSumOfHidden(h, labels) / targets.ne(-100).sum().to(torch::kFloat32);
}

torch::Tensor Model::lossSum(const torch::Tensor &ids, const torch::Tensor &labels) {
  return lossSumOfHidden(impl->hidden(ids, /*training=*/true), labels);
}

torch::Tensor Model::evalLossSum(const torch::Tensor &ids, const torch::Tensor &labels, const ImageInput &images) {
  return lossSumOfHidden(impl->hidden(ids, /*training=*/false, &images), labels);
}

torch::Tensor Model::stageForward(const torch::Tensor &input) {
  ModelImpl &m = *impl;
  torch::Tensor x = m.firstStage ? torch::embedding(m.embedding, input.to(m.options.device)) : input;
  x = m.runLayers(x, m.firstLayer, m.endLayer, /*training=*/true, ImageSplice{});
  return m.lastStage ? m.norm(x, m.finalNorm) : x;
}

std::pair<int64_t, int64_t> Model::stageLayers() const {
  return {static_cast<int64_t>(impl->firstLayer), static_cast<int64_t>(impl->endLayer)};
}

torch::Tensor Model::lossSumOfHidden(const torch::Tensor &h, const torch::Tensor &labels) {
  const int64_t predicted = labels.size(1) - 1; // T - 1, or T with the next part's first label.
  torch::Tensor shifted = h.narrow(1, 0, predicted).reshape({-1, h.size(-1)});
  torch::Tensor targets = labels.to(h.device()).narrow(1, 1, predicted).reshape({-1});
  // The LM head and the loss fused over row chunks: the [tokens, vocab]
  // logits never exist whole (runtime/LinearCrossEntropy.h).
  return linearCrossEntropySum(shifted, impl->lmHead, targets);
}

std::vector<AdapterTensor> Model::adapters() const {
  std::vector<AdapterTensor> out;
  const std::string base = "base_model.model.";
  auto addLinear = [&](const LoraLinear &l) {
    if (!l.hasLora())
      return;
    const bool columns = l.split == TensorSplit::Columns, rows = l.split == TensorSplit::Rows;
    out.push_back({base + l.hfPath + ".lora_A.weight", l.loraA,
                   rows ? AdapterShard::TensorColumns : AdapterShard::None, 0, columns});
    out.push_back({base + l.hfPath + ".lora_B.weight", l.loraB,
                   columns ? AdapterShard::TensorRows : AdapterShard::None, 0, rows});
  };
  // Adapters of another pipeline stage's layers: kept for whole checkpoints.
  auto markStage = [&out](size_t from, bool local) {
    for (size_t k = from; k < out.size(); ++k)
      out[k].local = local;
  };
  for (size_t i = 0; i < impl->layers.size(); ++i) {
    const size_t from = out.size();
    const Layer &layer = impl->layers[i];
    const AttentionLayer &a = layer.attention;
    for (const LoraLinear *l : {&a.q, &a.k, &a.v, &a.o, &a.qA, &a.qB, &a.kvA, &a.kvB, &a.indexQ, &a.indexK, &a.indexWeights})
      addLinear(*l);
    const FfnLayer &f = layer.ffn;
    for (const LoraLinear *l : {&f.router, &f.gate, &f.up, &f.down, &f.sharedGate, &f.sharedUp, &f.sharedDown,
                                &f.sharedExpertGate})
      addLinear(*l);
    for (const LoraLinear *l : layer.lightning.linears())
      addLinear(*l);
    for (const LoraLinear *l : layer.kimiDelta.linears())
      addLinear(*l);
    for (const LoraLinear *l : layer.deltaNet.linears())
      addLinear(*l);
    // PEFT nests one ParamWrapper per targeted parameter of the experts
    // module; with both targeted, gate_up_proj is the inner (base_layer) one.
    if (f.gateUp.hasLora() || f.expertDown.hasLora()) {
      std::string experts = base + f.gateUp.hfParam.substr(0, f.gateUp.hfParam.rfind('.'));
      bool both = f.gateUp.hasLora() && f.expertDown.hasLora();
      const bool split = f.shard.split();
      const AdapterShard rows = split ? AdapterShard::ExpertRows : AdapterShard::None;
      const AdapterShard columns = split ? AdapterShard::ExpertColumns : AdapterShard::None;
      const int64_t r = impl->def.lora.rank;
      if (f.gateUp.hasLora()) {
        std::string p = experts + (both ? ".base_layer" : "");
        out.push_back({p + ".lora_A.weight", f.gateUp.loraA, rows, r});
        out.push_back({p + ".lora_B.weight", f.gateUp.loraB, columns, r});
      }
      if (f.expertDown.hasLora()) {
        out.push_back({experts + ".lora_A.weight", f.expertDown.loraA, rows, r});
        out.push_back({experts + ".lora_B.weight", f.expertDown.loraB, columns, r});
      }
    }
    markStage(from, i >= impl->firstLayer && i < impl->endLayer);
  }
  if (impl->vision) {
    const size_t from = out.size();
    for (const auto &[local, l] : std::as_const(*impl->vision).adaptable())
      addLinear(*l);
    markStage(from, impl->firstStage);
  }
  return out;
}

std::string Model::peftConfigJson(const std::string &baseModelPath) const {
  std::set<std::string> modules, parameters;
  for (size_t i = 0; i < impl->layers.size(); ++i) {
    const Layer &layer = impl->layers[i];
    const std::string &prefix = impl->def.layers[i].hfPrefix;
    auto rel = [&](const std::string &path) { return path.substr(prefix.size()); };
    const AttentionLayer &a = layer.attention;
    for (const LoraLinear *l : {&a.q, &a.k, &a.v, &a.o, &a.qA, &a.qB, &a.kvA, &a.kvB, &a.indexQ, &a.indexK, &a.indexWeights})
      if (l->hasLora())
        modules.insert(rel(l->hfPath));
    for (const LoraLinear *l : layer.lightning.linears())
      if (l->hasLora())
        modules.insert(rel(l->hfPath));
    for (const LoraLinear *l : layer.kimiDelta.linears())
      if (l->hasLora())
        modules.insert(rel(l->hfPath));
    for (const LoraLinear *l : layer.deltaNet.linears())
      if (l->hasLora())
        modules.insert(rel(l->hfPath));
    const FfnLayer &f = layer.ffn;
    for (const LoraLinear *l : {&f.gate, &f.up, &f.down, &f.sharedGate, &f.sharedUp, &f.sharedDown}) {
      if (!l->hasLora())
        continue;
      // PEFT 0.21 under transformers 5 rewrites target_modules entries whose
      // leaf is a pre-v5 expert name (gate_proj/up_proj/down_proj, w1/w2/w3)
      // into fused-expert targets for MoE families, which would drop the dense
      // and shared MLP adapters. As target_parameters (a 2-D ParamWrapper:
      // same keys, same function) they load as trained.
      std::string leaf = l->hfPath.substr(l->hfPath.rfind('.') + 1);
      bool remapped = leaf == "gate_proj" || leaf == "up_proj" || leaf == "down_proj" || leaf == "w1" ||
                      leaf == "w2" || leaf == "w3";
      if (remapped)
        parameters.insert(rel(l->hfPath) + ".weight");
      else
        modules.insert(rel(l->hfPath));
    }
    if (f.router.hasLora())
      parameters.insert(rel(f.router.hfPath) + ".weight");
    if (f.sharedExpertGate.hasLora())
      modules.insert(rel(f.sharedExpertGate.hfPath));
    for (const ExpertLinear *x : {&f.gateUp, &f.expertDown})
      if (x->hasLora())
        parameters.insert(rel(x->hfParam));
  }
  if (impl->vision)
    for (const auto &[local, l] : std::as_const(*impl->vision).adaptable())
      if (l->hasLora())
        modules.insert(local);
  auto list = [](const std::set<std::string> &items) {
    std::string s = "[";
    for (const std::string &i : items)
      s += (s.size() > 1 ? ", " : "") + jsonQuote(i);
    return s + "]";
  };
  const LoraDef &lora = impl->def.lora;
  std::ostringstream os;
  os.precision(17);
  // PEFT refuses dropout on expert parameters; dropout only acts in training.
  double dropout = parameters.empty() ? lora.dropout : 0.0;
  os << "{\n"
     << "  \"base_model_name_or_path\": " << jsonQuote(baseModelPath) << ",\n"
     << "  \"bias\": \"none\",\n"
     << "  \"fan_in_fan_out\": false,\n"
     << "  \"inference_mode\": true,\n"
     << "  \"init_lora_weights\": true,\n"
     << "  \"lora_alpha\": " << lora.alpha << ",\n"
     << "  \"lora_bias\": false,\n"
     << "  \"lora_dropout\": " << dropout << ",\n"
     << "  \"modules_to_save\": null,\n"
     << "  \"peft_type\": \"LORA\",\n"
     << "  \"r\": " << lora.rank << ",\n"
     << "  \"target_modules\": " << list(modules) << ",\n"
     << "  \"target_parameters\": " << (parameters.empty() ? std::string("null") : list(parameters)) << ",\n"
     << "  \"task_type\": \"CAUSAL_LM\",\n"
     << "  \"use_dora\": false,\n"
     << "  \"use_rslora\": " << (lora.rslora ? "true" : "false") << "\n"
     << "}\n";
  return os.str();
}

namespace {

/// W + scale * B A for a linear adapter, in fp32.
torch::Tensor mergedLinear(const LoraLinear &l) {
  torch::Tensor w = l.weight.to(torch::kFloat32);
  return w + l.scale * torch::matmul(l.loraB.detach(), l.loraA.detach()).to(w.device());
}

/// W[e] + scale * B_e A_e for every expert, [E, out, in] in fp32.
torch::Tensor mergedExperts(const ExpertLinear &x) {
  auto [a, b] = x.groupedFactors(torch::kFloat32);
  return x.weight.to(torch::kFloat32) + x.scale * torch::bmm(b.detach(), a.detach());
}

} // namespace

std::vector<std::pair<std::string, torch::Tensor>> Model::mergedWeights() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  // The checkpoint's own dtype; quantized tensors come back as bf16.
  auto dtypeOf = [&](const std::string &name) {
    std::string stored = impl->reader->has(name) ? impl->reader->info(name).dtype : "";
    if (stored == "F32" || stored == "F16" || stored == "BF16")
      return *scalarTypeOf(stored);
    return torch::kBFloat16;
  };
  auto emit = [&](const std::string &name, const torch::Tensor &t) {
    out.push_back({name, t.to(dtypeOf(name)).cpu().contiguous()});
  };
  if (impl->vision)
    for (const auto &[local, l] : std::as_const(*impl->vision).adaptable())
      if (l->hasLora())
        emit(l->checkpointName, mergedLinear(*l));
  for (size_t i = 0; i < impl->layers.size(); ++i) {
    const Layer &layer = impl->layers[i];
    const AttentionLayer &a = layer.attention;
    const FfnLayer &f = layer.ffn;
    for (const LoraLinear *l : {&a.q, &a.k, &a.v, &a.o, &a.qA, &a.qB, &a.kvA, &a.kvB, &a.indexQ, &a.indexK, &a.indexWeights, &f.router, &f.gate,
                                &f.up, &f.down, &f.sharedGate, &f.sharedUp, &f.sharedDown, &f.sharedExpertGate})
      if (l->hasLora())
        emit(l->checkpointName, mergedLinear(*l));
    for (const LoraLinear *l : layer.lightning.linears())
      if (l->hasLora())
        emit(l->checkpointName, mergedLinear(*l));
    for (const LoraLinear *l : layer.kimiDelta.linears())
      if (l->hasLora())
        emit(l->checkpointName, mergedLinear(*l));
    for (const LoraLinear *l : layer.deltaNet.linears())
      if (l->hasLora())
        emit(l->checkpointName, mergedLinear(*l));
    const auto &w = f.def.weights;
    const int64_t width = f.def.intermediate;
    if (f.gateUp.hasLora()) {
      torch::Tensor m = mergedExperts(f.gateUp);
      if (f.def.fusedLayout.empty()) {
        for (int64_t e = 0; e < m.size(0); ++e) {
          emit(expertName(w.at("gate_proj"), e), m[e].narrow(0, 0, width));
          emit(expertName(w.at("up_proj"), e), m[e].narrow(0, width, width));
        }
      } else {
        emit(w.at("gate_up_proj"), f.def.fusedLayout == "concat_out_in" ? m : m.transpose(1, 2));
      }
    }
    if (f.expertDown.hasLora()) {
      torch::Tensor m = mergedExperts(f.expertDown);
      if (f.def.fusedLayout.empty()) {
        for (int64_t e = 0; e < m.size(0); ++e)
          emit(expertName(w.at("down_proj"), e), m[e]);
      } else {
        emit(w.at("down_proj"), f.def.fusedLayout == "concat_out_in" ? m : m.transpose(1, 2));
      }
    }
  }
  return out;
}

std::vector<Model::ExpertGradient> Model::expertGradients() const {
  std::vector<ExpertGradient> out;
  ExpertLoad load = expertLoad();
  for (size_t i = 0; i < impl->layers.size(); ++i) {
    const FfnLayer &f = impl->layers[i].ffn;
    if (!f.isMoe() || !(f.gateUp.hasLora() || f.expertDown.hasLora()))
      continue;
    const int64_t experts = f.def.experts;
    torch::Tensor norms = torch::zeros({experts}, torch::kFloat64);
    for (const ExpertLinear *x : {&f.gateUp, &f.expertDown}) {
      if (!x->hasLora())
        continue;
      const int64_t rank = x->loraA.size(0) / experts;
      // Both layouts keep expert-major rows in A and expert-minor columns in B.
      if (x->loraA.grad().defined())
        norms += x->loraA.grad().detach().to(torch::kCPU, torch::kFloat64).view({experts, rank, -1})
                     .pow(2).sum(torch::IntArrayRef{1, 2});
      if (x->loraB.grad().defined())
        norms += x->loraB.grad().detach().to(torch::kCPU, torch::kFloat64).view({-1, rank, experts})
                     .pow(2).sum(torch::IntArrayRef{0, 1});
    }
    for (int64_t e = 0; e < experts; ++e)
      out.push_back({int64_t(i), e, i < load.size() && e < int64_t(load[i].size()) ? load[i][e] : 0,
                     std::sqrt(norms[e].item<double>())});
  }
  return out;
}

void Model::sumExpertLoad() {
  impl->summingLoad = true;
  for (torch::Tensor &t : impl->lastLoad)
    t = torch::Tensor();
}

std::vector<torch::Tensor> Model::loadTensors() const { return impl->lastLoad; }

void Model::setLoadTensors(std::vector<torch::Tensor> counters) { impl->lastLoad = std::move(counters); }

void Model::captureActivations(std::vector<std::pair<std::string, torch::Tensor>> *sink) {
  impl->capture = sink;
}

void Model::forceRouting(std::map<std::string, torch::Tensor> experts) {
  // The sparse-attention indexers' selections first: by the indexer's path.
  for (Layer &l : impl->layers) {
    if (experts.empty())
      l.attention.forcedSelection = torch::Tensor();
    auto given = experts.find(l.attention.indexerPath());
    if (l.attention.indexerPath().empty() || given == experts.end())
      continue;
    const torch::Tensor &keys = given->second;
    if (keys.dim() != 3 || (keys.numel() > 0 && (keys.min().item<int64_t>() < 0 ||
                                                 keys.max().item<int64_t>() >= keys.size(1))))
      throw badInput("", "--force-routing", "expected key positions [B, T, k] in [0, T) for " + given->first);
    torch::Tensor &held = l.attention.forcedSelection;
    if (held.defined() && held.sizes() == keys.sizes() && held.device() == keys.device() &&
        held.scalar_type() == keys.scalar_type())
      held.copy_(keys); // in place: a captured step (StepGraph) reads it
    else
      held = keys.clone();
    experts.erase(given);
  }
  std::map<std::string, int64_t> expertCounts;
  for (const Layer &l : impl->layers)
    if (l.ffn.isMoe())
      expertCounts[l.ffn.blockPath()] = l.ffn.def.experts;
  for (auto &[block, chosen] : experts) {
    auto count = expertCounts.find(block);
    checkForcedExperts(chosen, count == expertCounts.end() ? 0 : count->second, block);
  }
  // Same blocks and shapes as before: the new choice goes into the old
  // tensors, which a captured step (StepGraph) reads.
  bool inPlace = experts.size() == impl->forcedRouting.size();
  for (auto &[block, chosen] : experts) {
    auto old = impl->forcedRouting.find(block);
    inPlace = inPlace && old != impl->forcedRouting.end() && old->second.sizes() == chosen.sizes() &&
              old->second.device() == chosen.device() && old->second.scalar_type() == chosen.scalar_type();
  }
  if (inPlace) {
    for (auto &[block, chosen] : experts)
      impl->forcedRouting.at(block).copy_(chosen);
  } else { // Own copies: the caller's may be read-only views of a mapped file.
    for (auto &[block, chosen] : experts)
      chosen = chosen.clone();
    impl->forcedRouting = std::move(experts);
  }
}

int64_t Model::routingFlips() const {
  int64_t total = 0;
  for (const torch::Tensor &f : impl->lastFlips)
    if (f.defined())
      total += f.item<int64_t>();
  return total;
}

ExpertLoad Model::expertLoad() const {
  ExpertLoad out;
  for (const torch::Tensor &t : impl->lastLoad) {
    std::vector<int64_t> counts;
    if (t.defined()) {
      torch::Tensor c = t.to(torch::kCPU, torch::kInt64).contiguous();
      counts.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    }
    out.push_back(std::move(counts));
  }
  return out;
}

double Model::flopsPerToken(int64_t seqLen) const {
  const ModelDef &d = impl->def;
  double flops = headFlopsPerToken(d);
  for (const LayerDef &l : d.layers)
    flops += layerFlopsPerToken(d, l, seqLen);
  return flops;
}

} // namespace adapt::rt
