//===- InspectCommand.cpp - `adapt inspect` and `adapt gaps` -------------===//
//
// The two read-only commands over the front half of the pipeline
// (tools/ModelAnalysis.h: read, declare, import, verify, the gap passes):
// inspect prints what was found, gaps writes the report.
//
//===----------------------------------------------------------------------===//

#include "tools/InspectCommand.h"

#include "ir/AdaptDialect.h"
#include "parser/ConfigReader.h"
#include "passes/ReportWriter.h"
#include "tools/CommandLine.h"
#include "tools/ModelAnalysis.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/raw_ostream.h"

#include <iostream>
#include <map>

namespace adapt {

const char *const kInspectUsage =
    "  adapt inspect PATH [--emit summary|mlir|analysed] [--registry FILE]\n";
const char *const kGapsUsage = "  adapt gaps PATH --out DIR [--registry FILE]\n";

namespace {

/// The flags, parsed straight into the options (cl::location).
InspectOptions inspectFlags;
GapsOptions gapsFlags;
cl::SubCommand inspectCommand("inspect", "Summarise or print the IR of a model");
cl::SubCommand gapsCommand("gaps", "Write the gap report of a model");
PositionalField<std::string> inspectPath(inspectCommand, inspectFlags.path, "PATH");
FieldFlag<std::string> inspectEmit("emit", inspectCommand, inspectFlags.emit, "summary, mlir or analysed");
FieldFlag<std::string> inspectRegistry("registry", inspectCommand, inspectFlags.registry,
    "an op registry in place of the built-in one");
PositionalField<std::string> gapsPath(gapsCommand, gapsFlags.path, "PATH");
FieldFlag<std::string> gapsOut("out", gapsCommand, gapsFlags.out, "report folder");
cl::alias gapsOutShort("o", cl::aliasopt(gapsOut));
FieldFlag<std::string> gapsRegistry("registry", gapsCommand, gapsFlags.registry,
    "an op registry in place of the built-in one");

/// The human summary of `inspect`.
void printSummary(const Analysis &a) {
  const GapReport &r = a.report;
  const ParameterCounts &p = r.parameters;
  std::cout << "model        " << (r.modelType.empty() ? "(no model_type)" : r.modelType)
            << "  [" << r.architecture << "]\n";
  std::cout << "layout       " << r.family << " (recognised by its config keys)\n";
  if (a.files) {
    const ModelSpec &s = a.files->spec;
    std::map<std::string, std::vector<int64_t>> mixers, ffns;
    for (const LayerSpec &l : s.layers) {
      std::string mixer = mixerKindName(l.mixer.kind);
      if (l.mixer.indexTopK > 0)
        mixer = "sparse_mla(top-" + std::to_string(l.mixer.indexTopK) + ")";
      if (l.mixer.window != "none")
        mixer += "/" + l.mixer.window + "(" + std::to_string(l.mixer.windowSize) + ")";
      mixers[mixer].push_back(l.index);
      ffns[l.ffn.isMoe ? "moe" : "dense"].push_back(l.index);
    }
    std::cout << "layers       " << s.layers.size() << " decoder layers, hidden "
              << s.hidden << ", vocab " << s.vocab << "\n";
    for (const auto &[kind, layers] : mixers)
      std::cout << "  mixer      " << kind << ": " << formatLayerRanges(layers) << "\n";
    for (const auto &[kind, layers] : ffns)
      std::cout << "  ffn        " << kind << ": " << formatLayerRanges(layers) << "\n";
    for (const LayerSpec &l : s.layers)
      if (l.ffn.isMoe) {
        std::cout << "experts      " << l.ffn.numExperts << " routed, top-"
                  << l.ffn.topK << ", " << l.ffn.numShared << " shared, "
                  << l.ffn.scoring << " router"
                  << (l.ffn.groups > 1 ? ", group-limited" : "")
                  << (l.ffn.correctionBias ? ", bias correction" : "") << "\n";
        break;
      }
    if (s.numMtpLayers)
      std::cout << "mtp          " << s.numMtpLayers << " layer(s)\n";
    for (const EncoderSpec &e : s.encoders)
      std::cout << "encoder      " << e.modality << " (" << e.type << "), depth "
                << e.depth << ", width " << e.hidden << "\n";
    if (!s.quant.method.empty())
      std::cout << "quantized    " << s.quant.method << "\n";
  }
  std::cout << "parameters   total " << formatParameterCount(p.total) << " (decoder "
            << formatParameterCount(p.decoder) << ", mtp " << formatParameterCount(p.mtp)
            << ", encoders " << formatParameterCount(p.encoders) << ")\n";
  std::cout << "             active " << formatParameterCount(p.active)
            << " per token (without embedding " << formatParameterCount(p.activeWithoutEmbedding)
            << ", non-embedding " << formatParameterCount(p.activeNonEmbedding) << ")\n";
  if (!r.unknownConfigKeys.empty())
    std::cout << "unknown keys " << r.unknownConfigKeys.size()
              << " (listed by `adapt gaps`)\n";
  std::cout << "status       " << r.summary << "\n";
}

} // namespace

int runInspectCommand() { return inspectModel(inspectFlags); }
int runGapsCommand() { return writeGaps(gapsFlags); }

int inspectModel(const InspectOptions &options) {
  const std::string &emit = options.emit;
  if (options.path.empty())
    return usageError("inspect expects a PATH", kInspectUsage);
  if (emit != "summary" && emit != "mlir" && emit != "analysed")
    return usageError("--emit expects summary, mlir or analysed", kInspectUsage);
  mlir::MLIRContext context;
  context.getOrLoadDialect<AdaptDialect>();
  Analysis analysis;
  if (int code = analyseModel(context, {options.path, options.registry, emit != "mlir"}, analysis))
    return code;
  if (emit == "summary")
    printSummary(analysis);
  else
    analysis.module->print(llvm::outs());
  return kExitOk;
}

int writeGaps(const GapsOptions &options) {
  const std::string &out = options.out;
  if (options.path.empty())
    return usageError("gaps expects a PATH", kGapsUsage);
  if (out.empty())
    return usageError("gaps expects --out DIR", kGapsUsage);
  mlir::MLIRContext context;
  context.getOrLoadDialect<AdaptDialect>();
  Analysis analysis;
  if (int code = analyseModel(context, {options.path, options.registry, true}, analysis))
    return code;
  std::string error;
  if (!writeGapReport(analysis.report, out, error)) {
    std::cerr << "adapt: error: " << out << ": " << error << "\n";
    return kExitBadInput;
  }
  std::cout << analysis.report.summary << "\n"
            << "wrote " << out << "/gaps.json, gaps.md, gaps.html\n";
  if (const ManifestIssue *issue = contradictingManifestIssue(analysis.report)) {
    printManifestContradiction(analysis.report, *issue);
    return kExitBadInput;
  }
  return analysis.report.hasGaps() ? kExitGapsFound : kExitOk;
}

} // namespace adapt
