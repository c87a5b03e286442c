//===- ModelAnalysis.cpp - the front half every command shares ------------===//

#include "tools/ModelAnalysis.h"

#include "ir/ImportModel.h"
#include "parser/ConfigReader.h"
#include "passes/Passes.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"

#include <iostream>
#include <map>
#include <unordered_set>

#ifdef ADAPT_WITH_ONNX
#include "ir/ImportOnnx.h"
#endif

namespace adapt {

namespace {

/// An InputError as the one line users see.
int reportInputError(const InputError &error) {
  std::cerr << "adapt: error: " << error.message() << "\n";
  return kExitBadInput;
}

/// Counts components by status and writes the one-line summary.
void summarise(GapReport &report) {
  std::map<GapStatus, int> counts;
  for (const ComponentGap &c : report.components)
    ++counts[c.status];
  report.summary = std::to_string(report.components.size()) + " component variants: " +
                   std::to_string(counts[GapStatus::Supported]) + " supported, " +
                   std::to_string(counts[GapStatus::Partial]) + " partial, " +
                   std::to_string(counts[GapStatus::Missing]) + " missing";
  if (counts[GapStatus::Excluded])
    report.summary += ", " + std::to_string(counts[GapStatus::Excluded]) + " excluded from training";
  if (report.manifest.checked)
    report.summary += "; manifest: " + std::to_string(report.manifest.issues.size()) + " issues";
}

/// Imports a Hugging Face folder: the spec refined by the manifest's tensor
/// names, its components declared, and the report's model facts filled in.
int importFolder(mlir::MLIRContext &context, const std::string &path, Analysis &out) {
  Result<ModelFiles> files = loadModelFiles(path);
  if (!files)
    return reportInputError(files.error());
  out.files = std::move(files.value());
  ModelSpec &spec = out.files->spec;
  NameProbe probe;
  std::unordered_set<std::string> names;
  if (out.files->manifest) {
    for (const auto &entry : out.files->manifest->tensors)
      names.insert(entry.first);
    probe = [&names](const std::string &n) { return names.count(n) > 0; };
  }
  refineWithManifest(spec, probe);
  out.module = importModel(context, spec, declareModel(spec, probe));
  GapReport &report = out.report;
  report.modelType = spec.modelType;
  report.architecture = spec.architecture;
  report.family = spec.family;
  for (const UnknownKey &key : spec.unknownKeys)
    report.unknownConfigKeys.push_back({key.path, key.value});
  report.notes.insert(report.notes.end(), spec.notes.begin(), spec.notes.end());
  for (const Assumption &a : spec.assumptions)
    report.assumptions.push_back({a.feature, a.basis, a.confirmBy, a.status});
  return 0;
}

} // namespace

const OpRegistry &Analysis::opRegistry() const { return registry ? *registry : builtinOpRegistry(); }

int analyseModel(mlir::MLIRContext &context, const AnalysisOptions &options, Analysis &out) {
  out.report.source = options.path;
  if (!options.registryPath.empty()) {
    Result<OpRegistry> read = readOpRegistry(options.registryPath);
    if (!read)
      return reportInputError(read.error());
    out.registry = std::move(read.value());
  }
  if (isOnnxPath(options.path)) {
#ifdef ADAPT_WITH_ONNX
    Result<mlir::OwningOpRef<mlir::ModuleOp>> imported =
        importOnnxModel(context, options.path, out.report.architecture);
    if (!imported)
      return reportInputError(imported.error());
    out.module = std::move(imported.value());
    out.report.modelType = "onnx";
    out.report.family = "onnx";
#else
    return reportInputError({options.path, "", "this build of adapt has no ONNX support"});
#endif
  } else if (int code = importFolder(context, options.path, out)) {
    return code;
  }
  if (mlir::failed(mlir::verify(*out.module))) {
    std::cerr << "adapt: error: " << options.path
              << ": the config describes an inconsistent model (see the diagnostics above)\n";
    return kExitBadInput;
  }
  if (options.runPasses) {
    AnalysisContext analysisContext;
    analysisContext.registry = &out.opRegistry();
    analysisContext.report = &out.report;
    if (out.files && out.files->manifest) {
      analysisContext.manifest = &*out.files->manifest;
      analysisContext.headers = &out.files->headers;
    }
    mlir::PassManager pm(&context);
    populateGapPipeline(pm, analysisContext);
    if (mlir::failed(pm.run(*out.module))) {
      std::cerr << "adapt: error: " << options.path << ": analysis failed\n";
      return kExitBadInput;
    }
  }
  summarise(out.report);
  return 0;
}

const ManifestIssue *contradictingManifestIssue(const GapReport &report) {
  for (const ManifestIssue &issue : report.manifest.issues)
    if (issue.kind == "missing" || issue.kind == "shape" || issue.kind == "dtype")
      return &issue;
  return nullptr;
}

void printManifestContradiction(const GapReport &report, const ManifestIssue &issue) {
  std::cerr << "adapt: error: " << report.manifest.file << ": " << issue.tensor << ": expected " << issue.expected
            << ", found " << issue.found
            << " (the manifest disagrees with the config; `adapt gaps` writes every issue to gaps.json)\n";
}

} // namespace adapt
