//===- ModelBuild.cpp - loading a checkpoint into the model's layers ------===//
//
// ModelImpl's construction half: each layer kind built from its LayerDef and
// the checkpoint (names, shapes and dtypes checked), tensor-parallel column
// and row slices, this rank's experts, and the LoRA factors injected into
// every targeted projection. The forward half is Model.cpp.
//
//===----------------------------------------------------------------------===//

#include "runtime/FusedExperts.h"
#include "runtime/ModelImpl.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace adapt::rt {

/// The module path in the HF model for a checkpoint weight of \p layer.
std::string ModelImpl::hfPath(const LayerDef &layer, const std::string &checkpointName) const {
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

LoraLinear ModelImpl::linear(const LayerDef &layer, const std::map<std::string, std::string> &weights, const std::string &role, int64_t out, int64_t in, bool bias, std::optional<torch::ScalarType> dtype) {
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

Layer ModelImpl::buildLayer(const LayerDef &l) {
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
  layer.deltaNet.layerIndex = layer.kimiDelta.layerIndex = l.index;
  return layer;
}

/// MiniMax's lightning attention: weights by role (qkv_proj, output_gate,
/// norm, out_proj); the decay slopes follow from the layer index.
void ModelImpl::buildLightning(const LayerDef &l, LightningLayer &g) {
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
void ModelImpl::buildKimiDelta(const LayerDef &l, KimiDeltaLayer &g) {
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
void ModelImpl::buildGatedDeltaNet(const LayerDef &l, GatedDeltaNetLayer &g) {
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
void ModelImpl::buildSparseIndexer(const LayerDef &l, AttentionLayer &a) {
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

void ModelImpl::buildAttention(const LayerDef &l, AttentionLayer &a) {
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
torch::Tensor ModelImpl::tensorSlice(const torch::Tensor &t, int64_t dim, int64_t width) const {
  const int64_t part = width / tensorParallel();
  return t.narrow(dim, options.distributed->tensorRank() * part, part).contiguous();
}

/// A depthwise convolution [C, 1, K] over channels made of consecutive
/// blocks (q, k, v), each split by heads: this rank's rows of each block.
torch::Tensor ModelImpl::convolutionSlice(const torch::Tensor &conv, std::initializer_list<int64_t> blocks) const {
  std::vector<torch::Tensor> parts;
  int64_t start = 0;
  for (int64_t width : blocks) {
    parts.push_back(tensorSlice(conv.narrow(0, start, width), 0, width));
    start += width;
  }
  return torch::cat(parts).contiguous();
}

/// Tensor parallelism: the group size (1 when not split) and this rank's index.
int64_t ModelImpl::tensorParallel() const {
  const auto &dist = options.distributed;
  return dist ? dist->layout().tp : 1;
}

/// Keeps this rank's output rows of \p l (column-parallel: q, k, v, gate, up).
void ModelImpl::splitColumns(LoraLinear &l) {
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
void ModelImpl::splitRows(LoraLinear &l) {
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
int64_t ModelImpl::localExperts(int64_t experts) const {
  const auto &dist = options.distributed;
  return dist && dist->layout().ep > 1 ? experts / dist->layout().ep : experts;
}

int64_t ModelImpl::firstLocalExpert(int64_t experts) const {
  const auto &dist = options.distributed;
  return dist && dist->layout().ep > 1 ? dist->expertRank() * localExperts(experts) : 0;
}

/// This rank's experts of the fused [E, ...] tensor \p name (shape \p shape
/// checked whole first): only their bytes are read (loadRows).
torch::Tensor ModelImpl::loadLocalExperts(const std::string &name, std::vector<int64_t> shape) {
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
torch::Tensor ModelImpl::stackExperts(const std::string &pattern, int64_t experts, int64_t rows, int64_t cols) {
  std::vector<torch::Tensor> parts;
  const int64_t first = firstLocalExpert(experts);
  for (int64_t e = first; e < first + localExperts(experts); ++e)
    parts.push_back(load(expertName(pattern, e), {rows, cols}));
  return torch::stack(parts);
}

void ModelImpl::buildFfn(const LayerDef &l, FfnLayer &f) {
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
bool ModelImpl::targeted(const std::string &path, const LayerDef &layer) const {
  std::string local = path.substr(std::min(path.size(), layer.hfPrefix.size()));
  const auto &modules = def.lora.modules;
  return std::find(modules.begin(), modules.end(), local) != modules.end();
}

double ModelImpl::loraScale() const {
  const double r = static_cast<double>(def.lora.rank);
  return def.lora.rslora ? def.lora.alpha / std::sqrt(r) : def.lora.alpha / r;
}

/// Kaiming-uniform(a=sqrt(5)) on [rows, fanIn], as PEFT initialises lora_A.
torch::Tensor ModelImpl::initA(int64_t rows, int64_t fanIn) {
  double bound = 1.0 / std::sqrt(static_cast<double>(fanIn));
  torch::Tensor a = torch::empty({rows, fanIn}, torch::kFloat32);
  a.uniform_(-bound, bound, generator);
  return a.to(options.device).requires_grad_(true);
}

void ModelImpl::addLora(LoraLinear &l) {
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
void ModelImpl::addLora(ExpertLinear &x, int64_t allExperts) {
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

void ModelImpl::injectLora() {
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerDef &d = def.layers[i];
    FfnLayer &f = layers[i].ffn;
    for (LoraLinear *l : layers[i].linears())
      if (l->weight.defined() && targeted(l->hfPath, d))
        addLora(*l);
    if (f.isMoe()) {
      for (ExpertLinear *x : {&f.gateUp, &f.expertDown})
        if (targeted(x->hfParam, d))
          addLora(*x, f.def.experts);
      // On the GPU the experts' LoRA rides inside their grouped GEMMs where
      // the layer allows it; the CPU keeps the composition (the reference).
      if (options.device.is_cuda()) {
        f.recomputeExpertInputs = options.recomputeExpertInputs;
        prepareFusedExperts(f);
        f.prepareRouter(); // fp32 logits by a bf16 tensor-core GEMM (RouterLogits.h)
      }
    }
  }
  // Vision blocks: only the modules named (attn.qkv, attn.proj, mlp.linear_fc1/2).
  if (vision)
    for (auto &[local, l] : vision->adaptable())
      if (std::find(def.lora.modules.begin(), def.lora.modules.end(), local) != def.lora.modules.end())
        addLora(*l);
}
} // namespace adapt::rt
