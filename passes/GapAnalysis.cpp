//===- GapAnalysis.cpp - components against the operator registry ---------===//

#include "ir/AdaptDialect.h"
#include "passes/PassInput.h"
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"

#include <map>

namespace adapt {
#define GEN_PASS_DEF_GAPANALYSISPASS
#include "passes/Passes.h.inc"
} // namespace adapt

using namespace mlir;

namespace adapt {
namespace {

using Features = std::map<std::string, std::string>;

const char *yesNo(bool value) { return value ? "yes" : "no"; }

/// The features that select a library variant for one component op.
Features featuresOf(Operation *op) {
  Features f;
  if (auto a = dyn_cast<AttentionOp>(op)) {
    f["kind"] = stringifyAttentionKind(a.getKind()).str();
    f["rope"] = a.getRope().getScaling().str();
    f["window"] = stringifyWindowKind(a.getWindow()).str();
    f["sinks"] = yesNo(a.getSinks());
    f["output_gate"] = yesNo(a.getOutputGate());
    f["qk_norm"] = yesNo(a.getQkNorm());
    f["qkv_bias"] = yesNo(a.getQkvBias());
  } else if (auto s = dyn_cast<SparseAttentionOp>(op)) {
    f["indexer"] = s.getReusesIndexer() ? "shared" : "lightning";
    f["rope"] = s.getRope().getScaling().str();
  } else if (auto l = dyn_cast<LinearAttentionOp>(op)) {
    f["kind"] = stringifyLinearAttentionKind(l.getKind()).str();
    f["split_projections"] = yesNo(l.getSplitProjections());
  } else if (auto m = dyn_cast<MoEOp>(op)) {
    f["scoring"] = m.getScoring().str();
    f["activation"] = m.getActivation().str();
    f["grouped"] = yesNo(m.getNumGroups() > 1 && m.getTopkGroups() < m.getNumGroups());
    f["bias_correction"] = yesNo(m.getBiasCorrection());
    f["shared"] = yesNo(m.getNumShared() > 0);
    f["shared_gate"] = yesNo(m.getSharedGate());
    f["router_bias"] = yesNo(m.getRouterBias());
    f["swiglu"] = m.getSwigluLimit().convertToDouble() > 0 ? "clamped" : "plain";
  } else if (auto m = dyn_cast<MLPOp>(op)) {
    f["activation"] = m.getActivation().str();
  } else if (auto e = dyn_cast<EncoderOp>(op)) {
    f["modality"] = e.getModality().str();
    f["type"] = e.getEncoderType().str();
  } else if (auto u = dyn_cast<UnmappedOp>(op)) {
    f["domain"] = u.getDomain().str();
    f["op_type"] = u.getOpType().str();
  } else if (auto g = dyn_cast<GenericComponentOp>(op)) {
    f["kind"] = g.getKind().str();
  }
  return f;
}

/// A stable id: op name plus the features that differ from the plain case.
std::string variantId(Operation *op, const Features &f) {
  std::string id = op->getName().stripDialect().str();
  for (const auto &[key, value] : f) {
    if (value == "no" || value == "none" || value == "plain" || value == "default")
      continue;
    if (key == "activation" && value == "silu" && isa<MoEOp>(op)) // SwiGLU experts: the plain case.
      continue;
    id += "." + (value == "yes" ? key : value);
  }
  return id;
}

std::string describe(const Features &f) {
  std::string out;
  for (const auto &[key, value] : f)
    out += (out.empty() ? "" : ", ") + key + "=" + value;
  return out;
}

/// Whether the registry entry allows LoRA on every linear weight role.
bool loraCovered(const RegistryEntry &entry, ArrayAttr weights, SymbolTable &symbols,
                 std::string &uncovered) {
  for (Attribute a : weights) {
    auto w = symbols.lookup<WeightOp>(llvm::cast<FlatSymbolRefAttr>(a).getValue());
    // Routers and the output head are LoRA targets only on request (PEFT's
    // all-linear leaves the head out too): they never block support.
    if (!w || !w.getLinear() || w.getRole() == "gate" || w.getRole() == "router" ||
        w.getRole() == "lm_head")
      continue;
    if (std::find(entry.loraTargets.begin(), entry.loraTargets.end(),
                  w.getRole().str()) == entry.loraTargets.end()) {
      uncovered = w.getRole().str();
      return false;
    }
  }
  return true;
}

/// What closes \p gap, in the report's words ("" when nothing is needed).
std::string nextStep(const ComponentGap &gap, bool unseen) {
  const std::string generate = "run adapt generate PATH --out DIR --only " + gap.id +
                               ": it proposes an operator for this variant, checks it against a float64 "
                               "reference and queues it for adapt review; an approved one makes it supported";
  if (gap.status == GapStatus::Supported || gap.status == GapStatus::Excluded)
    return "";
  if (unseen)
    return generate + "; or, if the value is a new name for a kind adapt knows, extend the config reader";
  if (gap.registryEntry.empty())
    return generate;
  if (gap.blocks.forward || gap.blocks.backward)
    return generate + " (the registry's variant has no " + (gap.blocks.forward ? "forward" : "backward") + " yet)";
  return "LoRA cannot train every projection here: leave the uncovered one out of the LoRA targets "
         "(adapt build --lora-targets ...), or generate the adapter path with adapt generate";
}

struct GapAnalysisPass : impl::GapAnalysisPassBase<GapAnalysisPass> {
  using GapAnalysisPassBase::GapAnalysisPassBase;
  explicit GapAnalysisPass(AnalysisContext context) : context(context) {}

  void runOnOperation() override {
    std::optional<OpRegistry> owned;
    mlir::FailureOr<const OpRegistry *> registry =
        passInput(context.registry, registryPath, owned, readOpRegistry, getOperation());
    if (mlir::failed(registry))
      return signalPassFailure();
    analyse(getOperation(), *registry ? **registry : builtinOpRegistry());
  }

  void analyse(ModelOp model, const OpRegistry &registry) {
    SymbolTable symbols(model);
    Builder b(model.getContext());
    std::map<std::string, ComponentGap> byId;
    std::vector<std::string> order;
    model.walk([&](Operation *op) {
      auto weights = op->getAttrOfType<ArrayAttr>("weights");
      if (!weights || isa<ModelOp>(op))
        return;
      Features features = featuresOf(op);
      std::string id = variantId(op, features);
      // Enumerated config values never seen (the importer's "unseen"): the
      // component is missing whatever the registry holds for the rest.
      std::vector<std::string> unseen;
      if (auto values = op->getAttrOfType<ArrayAttr>("unseen"))
        for (Attribute v : values)
          unseen.push_back(llvm::cast<StringAttr>(v).str());
      for (const std::string &u : unseen)
        id += ".unseen(" + u.substr(0, u.find(" =")) + ")";
      ComponentGap gap;
      gap.id = id;
      gap.op = op->getName().getStringRef().str();
      gap.variant = describe(features);
      gap.features = features;
      std::string nearMiss;
      const RegistryEntry *entry =
          registry.match(gap.op, features, nearMiss);
      bool hasLinear = false;
      for (Attribute a : weights)
        if (auto w = symbols.lookup<WeightOp>(llvm::cast<FlatSymbolRefAttr>(a).getValue()))
          hasLinear |= w.getLinear();
      std::vector<std::string> layouts = {"data_parallel", "tensor_parallel", "pipeline_parallel"};
      if (isa<MoEOp>(op))
        layouts.push_back("expert_parallel");
      if (isa<AttentionOp, SparseAttentionOp, LinearAttentionOp>(op))
        layouts.push_back("context_parallel");
      if (!entry) {
        gap.status = GapStatus::Missing;
        gap.reasons.push_back(
            "no library op variant covers " + gap.op + " with " + gap.variant +
            (nearMiss.empty() ? "" : "; closest: " + nearMiss));
        if (features["split_projections"] == "yes") {
          std::string roles;
          for (Attribute a : weights)
            if (auto w = symbols.lookup<WeightOp>(llvm::cast<FlatSymbolRefAttr>(a).getValue()))
              if (w.getRole().starts_with("in_proj_"))
                roles += (roles.empty() ? "" : ", ") + w.getRole().str();
          gap.reasons.push_back("its input projections are stored split (" + roles +
                                "); the runtime's layer loads only the fused in_proj_qkvz and in_proj_ba");
        }
        if (isa<EncoderOp>(op)) // Structure alone does not make two towers the same.
          gap.reasons.push_back("the runtime's encoder is Qwen3-VL's vision tower; an encoder of type \"" +
                                features["type"] + "\" may be structurally alike but needs its own operator and "
                                "validation before " + (features["modality"] == "vision" ? std::string("images")
                                                                          : features["modality"] + " inputs") +
                                " can be trained (text-only training does not run it)");
        gap.blocks = {true, true, hasLinear, layouts};
      } else {
        gap.registryEntry = entry->id;
        std::string uncovered;
        bool lora = !hasLinear || loraCovered(*entry, weights, symbols, uncovered);
        const bool forward = entry->runsForward(), backward = entry->runsBackward();
        gap.blocks.forward = !forward;
        gap.blocks.backward = !backward;
        gap.blocks.lora = !lora || !backward;
        for (const std::string &layout : layouts)
          if (std::find(entry->parallel.begin(), entry->parallel.end(), layout) ==
              entry->parallel.end())
            gap.blocks.parallelLayouts.push_back(layout);
        if (!forward)
          gap.reasons.push_back("library variant " + entry->id + " is " +
                                entry->status + (entry->tracking.empty() ? "" : " (" + entry->tracking + ")") +
                                ": no forward yet");
        else if (!backward)
          gap.reasons.push_back("library variant " + entry->id + " has no backward yet");
        if (!lora)
          gap.reasons.push_back("LoRA not available on " + uncovered);
        gap.status = forward && backward && lora ? GapStatus::Supported
                     : forward                    ? GapStatus::Partial
                                                  : GapStatus::Missing;
        if (entry->status == "excluded") {
          // Deliberately not run by the training forward: the note says why.
          gap.status = GapStatus::Excluded;
          gap.blocks = {};
          gap.reasons.assign(1, "excluded from training: " + entry->note);
        }
      }
      if (!unseen.empty()) {
        gap.status = GapStatus::Missing;
        gap.registryEntry.clear();
        gap.blocks = {true, true, hasLinear, layouts};
        std::string values;
        for (const std::string &u : unseen)
          values += (values.empty() ? "" : ", ") + u;
        gap.reasons.assign(1, "config.json sets " + values +
                                  ", a value adapt has never seen: its parameters are counted as the nearest "
                                  "known case, but no library operator implements it; write one with "
                                  "`adapt generate` (then `adapt review`), or extend the reader if it is a "
                                  "new name for a known kind");
      }
      gap.nextStep = nextStep(gap, !unseen.empty());
      op->setAttr("status", b.getStringAttr(gapStatusName(gap.status)));
      op->setAttr("variant", b.getStringAttr(id));
      if (!gap.reasons.empty()) {
        llvm::SmallVector<Attribute> reasons;
        for (const std::string &r : gap.reasons)
          reasons.push_back(b.getStringAttr(r));
        op->setAttr("gap_reasons", b.getArrayAttr(reasons));
      }
      int64_t layer = op->getAttrOfType<IntegerAttr>("layer").getInt();
      int64_t params = 0, active = 0;
      if (auto p = op->getAttrOfType<IntegerAttr>("params"))
        params = p.getInt();
      if (auto p = op->getAttrOfType<IntegerAttr>("active_params"))
        active = p.getInt();
      auto [it, inserted] = byId.emplace(id, gap);
      if (inserted)
        order.push_back(id);
      ComponentGap &group = it->second;
      if (layer >= 0 && (group.layers.empty() || group.layers.back() != layer))
        group.layers.push_back(layer);
      group.parameters += params;
      group.activeParameters += active;
    });
    if (std::optional<ComponentGap> weights = weightFormat(model, registry)) {
      byId.emplace(weights->id, *weights);
      order.push_back(weights->id);
    }
    if (!context.report)
      return;
    for (const std::string &id : order)
      context.report->components.push_back(std::move(byId[id]));
  }

  /// The checkpoint's weight format (quantization_config / hf_quant_config)
  /// as a component: the trainer must load these tensors, and the runtime's
  /// loader reads only the formats the registry lists (adapt.weights
  /// entries: FP8 blocks, MXFP4; plain tensors need no entry). Any other
  /// format is missing, however well the rest of the model is covered.
  static std::optional<ComponentGap> weightFormat(ModelOp model, const OpRegistry &registry) {
    auto quant = model->getAttrOfType<QuantAttr>("adapt.quant");
    if (!quant)
      return std::nullopt;
    Features features = {{"quantization", quant.getMethod().str()}};
    if (!quant.getFormat().empty())
      features["format"] = quant.getFormat().str();
    ComponentGap gap;
    gap.op = "adapt.weights";
    gap.id = "weights." + features["quantization"];
    gap.variant = describe(features);
    gap.features = features;
    std::string nearMiss;
    if (const RegistryEntry *entry = registry.match(gap.op, features, nearMiss)) {
      gap.registryEntry = entry->id;
      gap.status = GapStatus::Supported;
      return gap;
    }
    std::string formats;
    for (const RegistryEntry &entry : registry.entries)
      if (entry.op == gap.op)
        for (const std::string &value : entry.match.count("quantization")
                                            ? entry.match.at("quantization")
                                            : std::vector<std::string>{})
          formats += (formats.empty() ? "" : ", ") + value;
    gap.status = GapStatus::Missing;
    gap.blocks = {true, true, true, {}};
    gap.nextStep = "the runtime needs a loader that dequantizes " + features["quantization"] +
                   " tensors while reading them (runtime/SafetensorsIO.h, as for FP8 blocks and MXFP4); "
                   "until then, train from a bf16 copy of the checkpoint";
    gap.reasons.push_back("the runtime's weight loader reads plain tensors and " +
                          (formats.empty() ? std::string("no quantized format") : formats) +
                          ", not " + gap.variant +
                          ": a generated trainer could not load these weights; the runtime "
                          "needs a loader (dequantizing on load) for this format");
    return gap;
  }

  AnalysisContext context;
};

} // namespace

std::unique_ptr<Pass> createGapAnalysisPass(AnalysisContext context) {
  return std::make_unique<GapAnalysisPass>(context);
}

} // namespace adapt
