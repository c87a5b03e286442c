//===- InjectLora.cpp - choose the weights that get LoRA adapters ---------===//

#include "ir/AdaptDialect.h"
#include "models/LoraTargets.h"
#include "passes/Passes.h"

#include <set>

#include "mlir/IR/BuiltinOps.h"

namespace adapt {
#define GEN_PASS_DEF_INJECTLORAPASS
#include "passes/Passes.h.inc"
} // namespace adapt

using namespace mlir;

namespace adapt {
namespace {

struct InjectLoraPass : impl::InjectLoraPassBase<InjectLoraPass> {
  using InjectLoraPassBase::InjectLoraPassBase;

  void runOnOperation() override {
    if (failed(inject(getOperation())))
      signalPassFailure();
  }

  LogicalResult inject(ModelOp model) {
    if (rank < 1)
      return model.emitError() << "LoRA rank must be >= 1, got "
                               << int64_t(rank);
    if (!(alpha > 0))
      return model.emitError() << "LoRA alpha must be > 0, got "
                               << double(alpha);
    if (!(dropout >= 0 && dropout < 1))
      return model.emitError() << "LoRA dropout must be in [0, 1), got "
                               << double(dropout);
    // Every linear weight of a decoder layer's mixer or FFN, in IR order.
    SymbolTable symbols(model);
    std::vector<LoraModule> modules;
    std::vector<WeightOp> weights;
    llvm::DenseSet<Operation *> seen;
    std::string family = model.getFamily().str();
    model.walk([&](Operation *op) {
      auto refs = op->getAttrOfType<ArrayAttr>("weights");
      if (!refs || isa<ModelOp>(op))
        return;
      std::string component = op->getName().stripDialect().str();
      for (Attribute a : refs) {
        auto weight = symbols.lookup<WeightOp>(
            llvm::cast<FlatSymbolRefAttr>(a).getValue());
        if (!weight || !weight.getLinear() || !seen.insert(weight).second)
          continue;
        std::optional<LoraModule> module = loraModuleOf(
            component, weight.getRole().str(), weight.getSymName().str(), family);
        if (!module)
          continue;
        modules.push_back(*module);
        weights.push_back(weight);
      }
    });
    std::vector<std::string> patterns(targets.begin(), targets.end());
    LoraSelection selection = selectLoraTargets(modules, patterns, router);
    if (!selection.error.empty())
      return model.emitError(selection.error);
    Builder b(model.getContext());
    int64_t adapted = 0;
    std::set<std::string> adaptedModules;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (!selection.selected[i]) {
        weights[i].removeLoraAttr();
        continue;
      }
      ++adapted;
      adaptedModules.insert(modules[i].local);
      NamedAttrList lora;
      lora.append("rank", b.getI64IntegerAttr(rank));
      lora.append("alpha", b.getF64FloatAttr(alpha));
      lora.append("module", b.getStringAttr(modules[i].path));
      weights[i].setLoraAttr(b.getDictionaryAttr(lora));
    }
    if (selection.routers > 0)
      model.emitWarning()
          << "adapting " << selection.routers
          << " MoE router weight(s) (--lora-router): this disturbs the "
             "pretrained load balance; watch the expert load while training";
    llvm::SmallVector<Attribute> given;
    for (const std::string &p : patterns.empty()
                                    ? std::vector<std::string>{"all-linear"}
                                    : patterns)
      given.push_back(b.getStringAttr(p));
    NamedAttrList settings;
    settings.append("rank", b.getI64IntegerAttr(rank));
    settings.append("alpha", b.getF64FloatAttr(alpha));
    settings.append("dropout", b.getF64FloatAttr(dropout));
    settings.append("rslora", b.getBoolAttr(rslora));
    settings.append("router", b.getBoolAttr(router));
    settings.append("targets", b.getArrayAttr(given));
    settings.append("adapted", b.getI64IntegerAttr(adapted));
    llvm::SmallVector<Attribute> resolved;
    for (const std::string &m : adaptedModules)
      resolved.push_back(b.getStringAttr(m));
    settings.append("modules", b.getArrayAttr(resolved));
    model->setAttr("adapt.lora", b.getDictionaryAttr(settings));
    return success();
  }
};

} // namespace
} // namespace adapt
