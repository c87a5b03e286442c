//===- Model.cpp - a decoder assembled from the operator library ----------===//
//
// The forward half of Model: embedding, layers, LM head and loss; adapters
// (PEFT names and config), merged weights, forced routing and expert load.
// Loading the checkpoint into layers is ModelBuild.cpp; the state both share
// is ModelImpl.h.
//
//===----------------------------------------------------------------------===//

#include "runtime/ModelImpl.h"
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
    for (const LoraLinear *l : layer.linears())
      addLinear(*l);
    const FfnLayer &f = layer.ffn;
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
    const FfnLayer &f = layer.ffn;
    const std::set<const LoraLinear *> mlp = {&f.gate, &f.up, &f.down, &f.sharedGate, &f.sharedUp, &f.sharedDown};
    for (const LoraLinear *l : layer.linears()) {
      if (!l->hasLora())
        continue;
      // PEFT 0.21 under transformers 5 rewrites target_modules entries whose
      // leaf is a pre-v5 expert name (gate_proj/up_proj/down_proj, w1/w2/w3)
      // into fused-expert targets for MoE families, which would drop the dense
      // and shared MLP adapters. As target_parameters (a 2-D ParamWrapper:
      // same keys, same function) they load as trained; so does the router.
      std::string leaf = l->hfPath.substr(l->hfPath.rfind('.') + 1);
      bool remapped = l == &f.router || (mlp.count(l) && (leaf == "gate_proj" || leaf == "up_proj" ||
                                                          leaf == "down_proj" || leaf == "w1" || leaf == "w2" ||
                                                          leaf == "w3"));
      if (remapped)
        parameters.insert(rel(l->hfPath) + ".weight");
      else
        modules.insert(rel(l->hfPath));
    }
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
    const FfnLayer &f = layer.ffn;
    for (const LoraLinear *l : layer.linears())
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
