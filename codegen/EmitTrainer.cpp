//===- EmitTrainer.cpp - a LoRA training program from the IR --------------===//
//
// Each decoder layer becomes the C++ statements that fill one LayerDef, with
// tensor names written relative to the layer's prefix `p`. Layers whose
// statements are then identical share one helper function taking the layer
// index; the layer list is emitted as runs (and short repeating cycles, e.g.
// gpt-oss's sliding/full alternation) of those helpers.
//
//===----------------------------------------------------------------------===//

#include "codegen/EmitTrainer.h"
#include "codegen/EmitLayer.h"
#include "ir/AdaptDialect.h"
#include "models/LoraTargets.h"

#include "mlir/IR/SymbolTable.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>

using namespace mlir;
using namespace adapt::codegen;

namespace adapt {

std::string formatDouble(double value) {
  if (std::isnan(value))
    return "std::nan(\"\")";
  if (std::isinf(value))
    return value > 0 ? "HUGE_VAL" : "-HUGE_VAL";
  char buf[64];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.1f", value);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value)
      break;
  }
  return buf;
}

namespace {

/// A helper function shared by structurally identical layers.
struct Helper {
  std::string name, body, summary;
  std::vector<int64_t> layers;
};

/// camelCase helper name: "slidingmoe" parts -> "slidingMoeLayer".
std::string helperName(const std::string &shape) {
  // shape is window part ("sliding", "chunked", "nope", "") + ffn part.
  std::string ffn = shape.size() >= 5 && shape.substr(shape.size() - 5) == "dense"
                        ? "dense"
                        : "moe";
  std::string head = shape.substr(0, shape.size() - ffn.size());
  std::string out = head.empty() ? ffn : head;
  if (!head.empty()) {
    std::string cap = ffn;
    cap[0] = (char)std::toupper((unsigned char)cap[0]);
    out += cap;
  }
  return out + "Layer";
}

/// Emits the layer list: runs of one helper or short cycles of several.
std::string emitLayerList(const std::vector<int> &ids,
                          const std::vector<Helper> &helpers,
                          const std::vector<int64_t> &indices) {
  std::string out;
  size_t n = ids.size(), s = 0;
  int cycles = 0;
  while (s < n) {
    size_t run = 1;
    while (s + run < n && ids[s + run] == ids[s])
      ++run;
    size_t bestPeriod = 1, bestLength = run;
    for (size_t period = 2; period <= 4 && s + period <= n; ++period) {
      bool uniform = true;
      for (size_t k = 1; k < period; ++k)
        uniform &= ids[s + k] == ids[s];
      if (uniform)
        continue;
      size_t length = period;
      while (s + length < n && ids[s + length] == ids[s + length % period])
        ++length;
      if (length >= 2 * period && length > bestLength) {
        bestPeriod = period;
        bestLength = length;
      }
    }
    int64_t first = indices[s], end = indices[s] + (int64_t)bestLength;
    std::string offset = first == 0 ? "i" : "(i - " + std::to_string(first) + ")";
    if (bestPeriod == 1 && bestLength == 1) {
      out += "  m.layers.push_back(" + helpers[ids[s]].name + "(" +
             std::to_string(first) + "));\n";
    } else if (bestPeriod == 1) {
      out += "  for (int64_t i = " + std::to_string(first) + "; i < " +
             std::to_string(end) + "; ++i)\n    m.layers.push_back(" +
             helpers[ids[s]].name + "(i));\n";
    } else {
      std::string cycle = "cycle" + (cycles ? std::to_string(cycles) : std::string());
      ++cycles;
      out += "  static rt::LayerDef (*const " + cycle + "[])(int64_t) = {";
      for (size_t k = 0; k < bestPeriod; ++k)
        out += (k ? ", " : "") + helpers[ids[s + k]].name;
      out += "};\n  for (int64_t i = " + std::to_string(first) + "; i < " +
             std::to_string(end) + "; ++i)\n    m.layers.push_back(" + cycle +
             "[" + offset + " % " + std::to_string(bestPeriod) + "](i));\n";
    }
    s += bestLength;
  }
  return out;
}

/// ModelDef.vision for a Qwen3-VL vision tower: its shape from the encoder's
/// attributes, its checkpoint prefix from the patch embedding's name.
std::string emitVision(EncoderOp enc, const std::vector<RoleName> &weights) {
  std::string prefix = "model.visual.";
  const std::string suffix = "patch_embed.proj.weight";
  for (const RoleName &w : weights)
    if (w.first == "patch_embed" && w.second.size() >= suffix.size())
      prefix = w.second.substr(0, w.second.size() - suffix.size());
  std::ostringstream os;
  auto set = [&](const std::string &field, const std::string &value) {
    os << "  m.vision." << field << " = " << value << ";\n";
  };
  os << "  // The " << enc.getEncoderType().str() << " vision tower (runtime/Vision.h).\n";
  set("depth", std::to_string(enc.getDepth()));
  set("hidden", std::to_string(enc.getWidth()));
  set("heads", std::to_string(enc.getNumHeads()));
  set("intermediate", std::to_string(enc.getIntermediate()));
  set("patchSize", std::to_string(enc.getPatchSize()));
  set("temporalPatch", std::to_string(enc.getTemporalPatch()));
  set("inChannels", std::to_string(enc.getInChannels()));
  set("spatialMerge", std::to_string(enc.getSpatialMerge()));
  set("numPositions", std::to_string(enc.getNumPositions()));
  set("outHidden", std::to_string(enc.getOutWidth()));
  std::string layers;
  if (auto deepstack = enc.getDeepstackLayers())
    for (int64_t l : *deepstack)
      layers += (layers.empty() ? "" : ", ") + std::to_string(l);
  set("deepstackLayers", "{" + layers + "}");
  if (!enc.getActivation().empty())
    set("act", quote(enc.getActivation().str()));
  set("ropeTheta", formatDouble(enc.getRopeTheta().convertToDouble()));
  set("imageTokenId", std::to_string(enc.getImageTokenId()));
  set("prefix", quote(prefix));
  return os.str();
}

/// \p text inside a quoted CMake argument: backslashes, quotes and `$`
/// (variable references) escaped.
std::string cmakeEscape(const std::string &text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"' || c == '$')
      out += '\\';
    out += c;
  }
  return out;
}

std::string cmakeProjectName(const std::string &family) {
  std::string out = "adapt_trainer_";
  for (char c : family)
    out += std::isalnum((unsigned char)c) ? c : '_';
  return out;
}

/// ModelDef lines that route the layers of each generated operator to it.
std::string emitGeneratedOpUses(const std::vector<GeneratedOpUse> &uses) {
  std::string out;
  for (const GeneratedOpUse &use : uses) {
    const std::vector<int64_t> &layers = use.layers;
    if (layers.empty())
      continue;
    bool contiguous = layers.back() - layers.front() + 1 == (int64_t)layers.size();
    std::string loop = "  for (int64_t i = " + std::to_string(layers.front()) + "; i <= " +
                       std::to_string(layers.back()) + "; ++i)\n";
    if (!contiguous) {
      std::string list;
      for (int64_t l : layers)
        list += (list.empty() ? "" : ", ") + std::to_string(l);
      loop = "  for (int64_t i : {" + list + "})\n";
    }
    out += "  // Approved generated operator (adapt review): candidates/" + use.symbol +
           (use.cuda ? ".cu" : ".cpp") + ", sha256 " + use.sha256.substr(0, 12) + ".\n" + loop +
           "    m.layers[i]." + use.field + " = " + quote(use.component) + ";\n";
  }
  return out;
}

/// The CMake lines compiling each approved source with its entry renamed.
std::string generatedOpsCmake(const std::vector<GeneratedOpUse> &uses) {
  std::string out;
  bool cuda = false;
  for (const GeneratedOpUse &use : uses)
    cuda |= use.cuda;
  if (cuda)
    out += "# CUDA candidates: nvcc for the GPU of the machine that builds.\n"
           "set(CMAKE_CUDA_ARCHITECTURES native)\n"
           "set(CMAKE_CUDA_STANDARD 17)\n"
           "enable_language(CUDA)\n";
  for (const GeneratedOpUse &use : uses) {
    std::string file = "candidates/" + use.symbol + (use.cuda ? ".cu" : ".cpp");
    out += "# " + use.component + " (" + use.task + "), approved by " + use.approvedBy + "\n"
           "target_sources(train PRIVATE " + file + ")\n"
           "set_source_files_properties(" + file +
           " PROPERTIES COMPILE_DEFINITIONS adapt_candidate=" + use.symbol + ")\n";
  }
  return out;
}

/// candidates/<symbol>.cpp (the approved bytes) and generated_ops.cpp, which
/// registers each with the runtime (runtime/GeneratedOps.h).
void addGeneratedOpFiles(const std::vector<GeneratedOpUse> &uses,
                         std::vector<GeneratedFile> &files) {
  if (uses.empty())
    return;
  std::ostringstream os;
  os << "// Generated by `adapt build`: registers the approved generated operators.\n"
     << "// Do not edit: regenerate with `adapt build`.\n\n"
     << "#include \"runtime/GeneratedOps.h\"\n\n";
  for (const GeneratedOpUse &use : uses)
    os << "torch::Tensor " << use.symbol
       << "(const std::vector<torch::Tensor> &, const std::map<std::string, double> &);\n";
  os << "\nnamespace {\n";
  for (const GeneratedOpUse &use : uses)
    os << "const bool registered_" << use.symbol << " = adapt::rt::registerGeneratedOp(\n"
       << "    {" << quote(use.component) << ", " << quote(use.task) << ",\n     "
       << quote(use.sha256) << ", " << quote(use.approvedBy) << ", &" << use.symbol << "});\n";
  os << "} // namespace\n";
  files.push_back({"generated_ops.cpp", os.str()});
  for (const GeneratedOpUse &use : uses)
    files.push_back({"candidates/" + use.symbol + (use.cuda ? ".cu" : ".cpp"), use.source});
}

/// The `m.plannedLayout` lines of a model that adapt-apply-plan annotated
/// (`adapt build --plan`), or "".
std::string plannedLayoutText(ModelOp model) {
  std::optional<llvm::ArrayRef<int64_t>> layout = model.getParallelLayout();
  if (!layout || layout->size() != 5)
    return "";
  const llvm::ArrayRef<int64_t> l = *layout;
  std::ostringstream os;
  os << "  // adapt plan's layout: the default when no --tp/--ep/--pp/--cp/--dp is given.\n"
     << "  m.plannedLayout.present = true;\n"
     << "  m.plannedLayout.tp = " << l[0] << ";\n  m.plannedLayout.ep = " << l[1] << ";\n"
     << "  m.plannedLayout.pp = " << l[2] << ";\n  m.plannedLayout.cp = " << l[3] << ";\n"
     << "  m.plannedLayout.dp = " << l[4] << ";\n"
     << "  m.plannedLayout.recompute = " << (model.getRecompute() ? "true" : "false") << ";\n";
  return os.str();
}

} // namespace

bool emitTrainer(ModuleOp module, const TrainerOptions &options,
                 std::vector<GeneratedFile> &files, std::string &error) {
  ModelOp model;
  for (ModelOp m : module.getOps<ModelOp>()) {
    if (model) {
      error = "expected one adapt.model, found several";
      return false;
    }
    model = m;
  }
  if (!model) {
    error = "expected an adapt.model";
    return false;
  }
  SymbolTable symbols(model);
  std::string family = model.getFamily().str();

  // Gather the components.
  std::map<int64_t, LayerOps> layers;
  std::string embedding, finalNorm, lmHead;
  double normEps = 1e-6;
  bool tied = false, zeroCentredNorms = false;
  int64_t mtpLayers = 0;
  std::vector<std::string> encoders;
  std::string visionText; ///< ModelDef.vision assignments (Qwen3-VL's tower).
  for (Operation &op : model.getBody().front()) {
    auto layerAttr = op.getAttrOfType<IntegerAttr>("layer");
    int64_t layer = layerAttr ? layerAttr.getInt() : -1;
    std::vector<RoleName> weights =
        op.hasAttr("weights") ? weightsOf(&op, symbols) : std::vector<RoleName>();
    if (isa<EmbeddingOp>(op)) {
      if (!weights.empty())
        embedding = weights.front().second;
    } else if (auto n = dyn_cast<RMSNormOp>(op)) {
      if (weights.empty())
        continue;
      zeroCentredNorms |= n.getZeroCentred();
      if (layer < 0) {
        finalNorm = weights.front().second;
        normEps = n.getEps().convertToDouble();
        continue;
      }
      LayerOps &l = layers[layer];
      l.index = layer;
      if (weights.front().first == "input_layernorm")
        l.inputNorm = weights.front().second;
      else
        l.postAttentionNorm = weights.front().second;
    } else if (isa<AttentionOp, SparseAttentionOp, LinearAttentionOp>(op)) {
      layers[layer].index = layer;
      layers[layer].mixer = &op;
    } else if (isa<MoEOp, MLPOp>(op)) {
      layers[layer].index = layer;
      layers[layer].ffn = &op;
    } else if (auto head = dyn_cast<LMHeadOp>(op)) {
      tied = head.getTied();
      if (!weights.empty())
        lmHead = weights.front().second;
    } else if (isa<MTPOp>(op)) {
      ++mtpLayers;
    } else if (auto enc = dyn_cast<EncoderOp>(op)) {
      if (enc.getModality() == "vision" && enc.getEncoderType().starts_with("qwen3_vl"))
        visionText = emitVision(enc, weights);
      else
        encoders.push_back(enc.getModality().str());
    } else if (isa<UnmappedOp, GenericComponentOp>(op)) {
      error = "the model has imported operators (" +
              op.getName().getStringRef().str() +
              ") with no ModelDef form; adapt build needs a Hugging Face model "
              "folder";
      return false;
    }
  }
  if (layers.empty()) {
    error = "the model has no decoder layers";
    return false;
  }
  // A component decided by a config value never seen has no faithful form:
  // generating its nearest known kind would train a different model.
  for (Operation &op : model.getBody().front())
    if (auto unseen = op.getAttrOfType<ArrayAttr>("unseen")) {
      error = "config.json sets " + llvm::cast<StringAttr>(unseen[0]).str() +
              ", a value adapt has never seen (see the gap report); no trainer is generated for it";
      return false;
    }

  // One body per layer; identical bodies share a helper.
  std::vector<Helper> helpers;
  std::map<std::string, int> byBody;
  std::vector<int> ids;
  std::vector<int64_t> indices;
  std::map<std::string, int> nameUses;
  for (auto &[index, ops] : layers) {
    codegen::LayerText layerText;
    if (!codegen::emitLayer(ops, symbols, family, layerText, error))
      return false;
    auto [it, inserted] = byBody.emplace(layerText.body, (int)helpers.size());
    if (inserted) {
      std::string name = helperName(layerText.shape);
      int uses = ++nameUses[name];
      if (uses > 1)
        name += std::to_string(uses);
      helpers.push_back({name, layerText.body, layerText.summary, {}});
    }
    helpers[it->second].layers.push_back(index);
    ids.push_back(it->second);
    indices.push_back(index);
  }
  // Layers must be numbered 0..n-1 for the loops; ModelDef's index says so.
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] != (int64_t)i) {
      error = "decoder layers are not numbered 0.." +
              std::to_string(indices.size() - 1);
      return false;
    }

  // LoRA settings as adapt-inject-lora recorded them.
  int64_t rank = 8;
  double alpha = 16.0, dropout = 0.0;
  bool rslora = false, router = false;
  std::vector<std::string> targets = {"all-linear"};
  std::vector<std::string> modules;
  if (auto lora = model->getAttrOfType<DictionaryAttr>("adapt.lora")) {
    if (auto v = lora.getAs<IntegerAttr>("rank"))
      rank = v.getInt();
    if (auto v = lora.getAs<FloatAttr>("alpha"))
      alpha = v.getValueAsDouble();
    if (auto v = lora.getAs<FloatAttr>("dropout"))
      dropout = v.getValueAsDouble();
    if (auto v = lora.getAs<BoolAttr>("rslora"))
      rslora = v.getValue();
    if (auto v = lora.getAs<BoolAttr>("router"))
      router = v.getValue();
    if (auto v = lora.getAs<ArrayAttr>("targets")) {
      targets.clear();
      for (Attribute t : v)
        targets.push_back(llvm::cast<StringAttr>(t).str());
    }
    if (auto v = lora.getAs<ArrayAttr>("modules"))
      for (Attribute t : v)
        modules.push_back(llvm::cast<StringAttr>(t).str());
  }
  std::string targetList, moduleList;
  for (const std::string &t : targets)
    targetList += (targetList.empty() ? "" : ", ") + quote(t);
  for (const std::string &t : modules)
    moduleList += "\n      " + quote(t) + ",";

  std::string architecture = model.getArchitecture().str();
  std::ostringstream os;
  os << "// Generated by `adapt build` from " << options.modelDir << " (relative to this folder): "
     << family << (architecture.empty() ? "" : " (" + architecture + ")") << ", "
     << layers.size() << " decoder layers.\n"
     << "// Do not edit: regenerate with `adapt build`.\n";
  if (mtpLayers > 0 || !encoders.empty()) {
    os << "// Not part of the trainer (left as they are):";
    if (mtpLayers > 0)
      os << " " << mtpLayers << " multi-token-prediction layer(s)";
    for (size_t i = 0; i < encoders.size(); ++i)
      os << (mtpLayers > 0 || i ? "," : "") << " the " << encoders[i] << " encoder";
    os << ".\n";
  }
  if (auto quant = model->getAttrOfType<QuantAttr>("adapt.quant"))
    os << "// The checkpoint is quantized (" << quant.getMethod().str()
       << "); the runtime loader decides how to read it.\n";
  os << "\n#include \"runtime/ModelDef.h\"\n#include \"runtime/TrainMain.h\"\n\n"
     << "#include <cstdint>\n#include <string>\n\n"
     << "namespace rt = adapt::rt;\n\nnamespace {\n";
  for (const Helper &h : helpers)
    os << "\n// Layer" << (h.layers.size() > 1 ? "s " : " ")
       << formatRanges(h.layers) << ": " << h.summary << ".\n"
       << "rt::LayerDef " << h.name << "(int64_t i) {\n"
       << h.body << "}\n";
  os << "\n} // namespace\n\n"
     << "adapt::rt::ModelDef buildModel() {\n"
     << "  rt::ModelDef m;\n"
     << "  m.family = " << quote(family) << ";\n"
     << "  m.modelType = " << quote(model.getModelType().str()) << ";\n"
     << "  m.architecture = " << quote(architecture) << ";\n"
     << "  m.vocab = " << model.getVocab() << ";\n"
     << "  m.hidden = " << model.getHidden() << ";\n"
     << "  m.normEps = " << formatDouble(normEps) << ";\n"
     << "  m.tieEmbeddings = " << (tied ? "true" : "false") << ";\n"
     << (zeroCentredNorms ? "  m.normWeightOffset = true; // RMSNorm scales by 1 + weight\n" : "")
     << "  m.embedding = " << quote(embedding) << ";\n"
     << "  m.finalNorm = " << quote(finalNorm) << ";\n"
     << "  m.lmHead = " << quote(lmHead) << ";\n"
     << "  m.lora.rank = " << rank << ";\n"
     << "  m.lora.alpha = " << formatDouble(alpha) << ";\n"
     << "  m.lora.dropout = " << formatDouble(dropout) << ";\n"
     << "  m.lora.rslora = " << (rslora ? "true" : "false") << ";\n"
     << "  m.lora.router = " << (router ? "true" : "false") << ";\n"
     << "  m.lora.targets = {" << targetList << "};\n"
     << "  m.lora.modules = {" << moduleList << (moduleList.empty() ? "" : "\n  ") << "};\n"
     << visionText
     << plannedLayoutText(model)
     << emitLayerList(ids, helpers, indices)
     << emitGeneratedOpUses(options.generatedOps)
     << "  return m;\n}\n\n"
     << "// The default --model: the model folder `adapt build` read, relative to\n"
     << "// this project; CMakeLists.txt makes it absolute where the project is built.\n"
     << "#ifndef ADAPT_DEFAULT_MODEL\n"
     << "#define ADAPT_DEFAULT_MODEL " << quote(options.modelDir) << "\n"
     << "#endif\n\n"
     << "int main(int argc, char **argv) {\n"
     << "  return adapt::rt::trainMain(argc, argv, buildModel(), ADAPT_DEFAULT_MODEL);\n"
     << "}\n";
  files.clear();
  files.push_back({"model.cpp", os.str()});

  files.push_back(
      {"CMakeLists.txt",
       "# Generated by `adapt build`; do not edit: regenerate.\n"
       "cmake_minimum_required(VERSION 3.20)\n"
       "project(" + cmakeProjectName(family) + " LANGUAGES CXX)\n"
       "set(CMAKE_CXX_STANDARD 17)\n"
       "set(CMAKE_CXX_STANDARD_REQUIRED ON)\n"
       "if(NOT CMAKE_BUILD_TYPE)\n"
       "  set(CMAKE_BUILD_TYPE Release)\n"
       "endif()\n"
       "# The runtime's build folder: -DAdaptRuntime_DIR=<adapt build>/runtime\n"
       "find_package(AdaptRuntime REQUIRED)\n"
       "add_executable(train model.cpp" +
           std::string(options.generatedOps.empty() ? "" : " generated_ops.cpp") + ")\n"
       "target_link_libraries(train PRIVATE adapt::runtime)\n"
       "# The trainer's default --model: the model folder `adapt build` read,\n"
       "# relative to this project.\n"
       "get_filename_component(ADAPT_DEFAULT_MODEL \"${CMAKE_CURRENT_SOURCE_DIR}/" +
           cmakeEscape(options.modelDir) + "\" ABSOLUTE)\n"
       "target_compile_definitions(train PRIVATE ADAPT_DEFAULT_MODEL=\"${ADAPT_DEFAULT_MODEL}\")\n" +
           generatedOpsCmake(options.generatedOps)});
  addGeneratedOpFiles(options.generatedOps, files);

  files.push_back(
      {"README.md",
       "# LoRA trainer for " + family + "\n\n"
       "Generated by `adapt build` from `" + options.modelDir +
       "` (relative to this folder); do not edit, regenerate instead.\n"
       "`model.cpp` describes the model to the runtime (`runtime/ModelDef.h`); "
       "the runtime does the rest.\n\n"
       "`adapt build` compiles it to `./train`; by hand:\n\n"
       "```sh\n"
       "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "
       "-DAdaptRuntime_DIR=<adapt build>/runtime\n"
       "cmake --build build\n"
       "build/train --help   # the runtime's flags; the model folder defaults "
       "to the one it was generated from\n"
       "```\n"});
  return true;
}

} // namespace adapt
