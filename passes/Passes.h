//===- Passes.h - adapt analysis passes -------------------------*- C++ -*-===//
#ifndef ADAPT_PASSES_PASSES_H
#define ADAPT_PASSES_PASSES_H

#include "passes/GapReport.h"
#include "passes/OpRegistry.h"
#include "parser/Manifest.h"
#include "parser/Safetensors.h"

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <memory>

namespace adapt {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

/// What the CLI hands the passes and where they put their findings. In
/// adapt-opt everything is null: passes read their options' files and
/// report through attributes and diagnostics only. A report is one model's:
/// the importer builds a module of one adapt.model, and the passes, anchored
/// on adapt.model, would write one report from several threads otherwise.
struct AnalysisContext {
  const Manifest *manifest = nullptr;             ///< Parsed index, if any.
  const std::vector<ShardHeader> *headers = nullptr; ///< Shard headers read.
  const OpRegistry *registry = nullptr;           ///< Default: built in.
  GapReport *report = nullptr;                    ///< Findings go here.
};

std::unique_ptr<mlir::Pass> createCheckManifestPass(AnalysisContext context);
std::unique_ptr<mlir::Pass> createCountParametersPass(AnalysisContext context);
std::unique_ptr<mlir::Pass> createGapAnalysisPass(AnalysisContext context);

/// The `adapt gaps` pipeline: manifest check (when there is a manifest),
/// parameter accounting, gap analysis.
void populateGapPipeline(mlir::OpPassManager &pm, const AnalysisContext &context);

/// The `adapt build` pipeline after the gap pipeline: LoRA adapters on the
/// components \p options targets.
void populateLoraPipeline(mlir::OpPassManager &pm, const InjectLoraPassOptions &options);

/// `adapt build --plan`: the plan's layout checked against the model and
/// recorded on it (adapt-apply-plan).
void populatePlanPipeline(mlir::OpPassManager &pm, const ApplyPlanPassOptions &options);

/// Registers the passes and the pipeline with adapt-opt.
void registerAdaptPassesAndPipelines();

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace adapt

#endif // ADAPT_PASSES_PASSES_H
