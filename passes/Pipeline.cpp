//===- Pipeline.cpp - the gap-report pipeline -----------------------------===//

#include "passes/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace adapt {

void buildGapPipeline(OpPassManager &pm, const AnalysisContext &context) {
  // Facts about the files first, so later passes can cite shards.
  if (context.manifest)
    pm.addPass(createCheckManifestPass(context));
  // Counts feed the gap report's per-component parameter figures.
  pm.addPass(createCountParametersPass(context));
  // Last: status per component, grouped into the report.
  pm.addPass(createGapAnalysisPass(context));
}

void registerAdaptPassesAndPipelines() {
  registerAdaptPasses();
  PassPipelineRegistration<>(
      "adapt-gap-pipeline",
      "Parameter accounting then gap analysis against the built-in registry",
      [](OpPassManager &pm) { buildGapPipeline(pm, AnalysisContext{}); });
}

} // namespace adapt
