//===- Pipelines.cpp - the compiler's pass pipelines ----------------------===//
//
// Every command and tool that analyses or transforms a model builds its pass
// manager from these (in the style of CIRCT's Firtool.cpp): `adapt gaps`,
// `inspect`, `build`, `generate`, and adapt-opt's registered pipeline.
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"
#include "passes/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace adapt {

// Every pass works on one adapt.model (IsolatedFromAbove), nested under the
// module the importer builds.

void populateGapPipeline(OpPassManager &pm, const AnalysisContext &context) {
  OpPassManager &model = pm.nest<ModelOp>();
  // Facts about the files first, so later passes can cite shards.
  if (context.manifest)
    model.addPass(createCheckManifestPass(context));
  // Counts feed the gap report's per-component parameter figures.
  model.addPass(createCountParametersPass(context));
  // Last: status per component, grouped into the report.
  model.addPass(createGapAnalysisPass(context));
}

void populateLoraPipeline(OpPassManager &pm, const InjectLoraPassOptions &options) {
  pm.nest<ModelOp>().addPass(createInjectLoraPass(options));
}

void populatePlanPipeline(OpPassManager &pm, const ApplyPlanPassOptions &options) {
  pm.nest<ModelOp>().addPass(createApplyPlanPass(options));
}

void registerAdaptPassesAndPipelines() {
  registerAdaptPasses();
  PassPipelineRegistration<>(
      "adapt-gap-pipeline",
      "Parameter accounting then gap analysis against the built-in registry",
      [](OpPassManager &pm) { populateGapPipeline(pm, AnalysisContext{}); });
}

} // namespace adapt
