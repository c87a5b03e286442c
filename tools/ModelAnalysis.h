//===- ModelAnalysis.h - the front half every command shares ----*- C++ -*-===//
//
// Read a model (Hugging Face folder or ONNX file), declare its components,
// import them into the adapt dialect, verify, and run the gap pipeline
// (passes/Pipelines.cpp). `adapt gaps`, `inspect`, `build` and `generate` all
// start here, in-process.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_TOOLS_MODELANALYSIS_H
#define ADAPT_TOOLS_MODELANALYSIS_H

#include "parser/ModelFolder.h"
#include "passes/GapReport.h"
#include "passes/OpRegistry.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <optional>
#include <string>

namespace adapt {

/// The model as IR plus what the passes found.
struct Analysis {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  GapReport report;
  std::optional<ModelFiles> files; ///< Absent for ONNX input.
  std::optional<OpRegistry> registry; ///< Read from --registry; absent: built in.

  /// The registry the analysis used.
  const OpRegistry &opRegistry() const;
};

/// What to analyse and how far.
struct AnalysisOptions {
  std::string path;         ///< Model folder, config.json or .onnx file.
  std::string registryPath; ///< --registry FILE, or "" for the built-in one.
  bool runPasses = true;    ///< false: import and verify only (`inspect --emit mlir`).
};

/// Reads, imports, verifies and (\p options.runPasses) analyses the model,
/// then writes the report's one-line summary. On failure prints one error
/// line naming the file, field and expectation and returns the exit code
/// (kExitBadInput); 0 on success.
int analyseModel(mlir::MLIRContext &context, const AnalysisOptions &options, Analysis &out);

/// The first manifest issue that contradicts the config (a missing tensor,
/// a wrong shape or dtype), or null: such a manifest cannot be trained.
const ManifestIssue *contradictingManifestIssue(const GapReport &report);

/// Prints \p issue as the one-line error every command uses.
void printManifestContradiction(const GapReport &report, const ManifestIssue &issue);

} // namespace adapt

#endif // ADAPT_TOOLS_MODELANALYSIS_H
