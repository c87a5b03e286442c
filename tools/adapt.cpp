//===- adapt.cpp - the adapt command line -----------------------------------===//
//
//   adapt inspect PATH [--emit summary|mlir|analysed]
//   adapt gaps PATH --out DIR [--registry FILE]
//   adapt tiny FAMILY --out DIR [--seed N] [--layers N] [--quant fp8|mxfp4]
//
// Exit codes (docs/exit-codes.md): 0 ok / nothing missing, 2 bad input or
// usage, 3 gaps found. Nothing else on any input: every failure is caught
// here and reported as one line on stderr.
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"
#include "ir/ImportModel.h"
#include "models/TinyModel.h"
#include "models/WeightSchema.h"
#include "parser/ConfigReader.h"
#include "parser/ModelFolder.h"
#include "passes/Passes.h"
#include "passes/ReportWriter.h"
#include "tools/BuildCommand.h"
#include "tools/GenerateCommand.h"
#include "tools/ReviewCommand.h"
#include "tools/ServeCommand.h"
#include "tools/ValidateCommand.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <unordered_set>

#ifdef ADAPT_WITH_ONNX
#include "ir/ImportOnnx.h"
#endif

using namespace adapt;

namespace {

constexpr const char *kUsage = R"(usage:
  adapt inspect PATH [--emit summary|mlir|analysed] [--registry FILE]
  adapt gaps PATH --out DIR [--registry FILE]
  adapt tiny FAMILY --out DIR [--seed N] [--layers N] [--quant fp8|mxfp4]
  adapt build PATH --out DIR [--lora-targets a,b] [--lora-rank R]
              [--lora-alpha A] [--lora-dropout P] [--rslora] [--lora-router]
              [--no-compile] [--runtime-dir DIR] [--allow-gaps] [--registry FILE]
  adapt validate PATH --stage op|model|parallel|full --out DIR
                 [--fixture DIR] [--runtime-dir DIR]
  adapt serve [--port N] [--host ADDR] [--token TOKEN] [--allow-host NAME]
              [--max-body BYTES] [--test-mode]
  adapt generate PATH --out DIR [--registry FILE] [--endpoint URL] [--model NAME]
                 [--api-key KEY] [--max-attempts N] [--max-tokens N] [--timeout S]
                 [--test-timeout S] [--retries N] [--target libtorch|cuda] [--only ID]
                 [--flag-speedup X]
  adapt review DIR [--only ID] | --approve ID [--by NAME] | --approve-noncritical
               | --reject ID --reason TEXT [--by NAME] | --export FILE [--registry BASE]
  adapt --help | --version

PATH is a model folder (config.json, optionally model.safetensors.index.json
and shards), a config.json file, or an .onnx file.

tiny writes a tiny random-weight model of FAMILY (qwen3_moe, mixtral,
deepseek_v3, kimi_k2, gpt_oss, glm4_moe, minimax_m2, llama4, qwen3_next,
kimi_linear, minimax, deepseek_v32, glm_moe_dsa, qwen3_vl_moe): config.json,
index and two BF16 shards; --quant fp8 for deepseek_v3/kimi_k2, mxfp4 for
gpt_oss. The same arguments write the same bytes.

generate proposes a candidate for every gap of PATH (a model or a gaps.json):
reuse rules first, then an LLM at an OpenAI-compatible endpoint (--endpoint or
ADAPT_LLM_BASE_URL, ADAPT_LLM_MODEL, ADAPT_LLM_API_KEY); records under DIR.
review shows them (diffs, IR, evidence) and records approvals (docs/agent.md).

serve runs a Model Context Protocol server on http://ADDR:N/mcp (default
127.0.0.1, port 0 = any free port, printed on stdout) until SIGINT/SIGTERM.

exit codes: 0 success (gaps: nothing missing), 2 bad input or usage,
            3 gaps found (gaps; build: the runtime cannot run the model),
            4 the generated trainer did not compile (build); a validation
              check failed (validate: the record names the first divergence)
            generate: 0 every gap has a candidate, 3 some gap has none
)";

/// Parsed command line.
struct Options {
  std::string command, path, out, emit = "summary", registry;
};

/// An InputError as the one line users see.
int reportInputError(const InputError &error) {
  std::cerr << "adapt: error: " << error.message() << "\n";
  return kExitBadInput;
}

bool parseArgs(int argc, char **argv, Options &opts, std::string &error) {
  if (argc < 2) {
    error = "expected a command";
    return false;
  }
  opts.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string &into) {
      if (i + 1 >= argc) {
        error = arg + " expects a value";
        return false;
      }
      into = argv[++i];
      return true;
    };
    if (arg == "--out" || arg == "-o") {
      if (!value(opts.out))
        return false;
    } else if (arg == "--emit") {
      if (!value(opts.emit))
        return false;
    } else if (arg == "--registry") {
      if (!value(opts.registry))
        return false;
    } else if (!arg.empty() && arg[0] == '-') {
      error = "unknown option " + arg;
      return false;
    } else if (opts.path.empty()) {
      opts.path = arg;
    } else {
      error = "unexpected argument " + arg;
      return false;
    }
  }
  if (opts.path.empty()) {
    error = "expected a PATH";
    return false;
  }
  if (opts.command == "gaps" && opts.out.empty()) {
    error = "gaps expects --out DIR";
    return false;
  }
  if (opts.emit != "summary" && opts.emit != "mlir" && opts.emit != "analysed") {
    error = "--emit expects summary, mlir or analysed";
    return false;
  }
  return true;
}

/// `adapt tiny FAMILY --out DIR [--seed N] [--layers N] [--quant Q]`.
int runTiny(int argc, char **argv) {
  TinyModelOptions options;
  std::string error;
  auto number = [&](const std::string &flag, const char *text,
                    uint64_t &into) {
    std::string s = text;
    errno = 0;
    char *end = nullptr;
    unsigned long long value = std::strtoull(s.c_str(), &end, 10);
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos ||
        *end != '\0' || errno == ERANGE) {
      error = flag + " expects an integer in 0.." +
              std::to_string(UINT64_MAX) + ", found \"" + s + "\"";
      return false;
    }
    into = value;
    return true;
  };
  for (int i = 2; i < argc && error.empty(); ++i) {
    std::string arg = argv[i];
    bool hasValue = i + 1 < argc;
    if ((arg == "--out" || arg == "-o" || arg == "--seed" ||
         arg == "--layers" || arg == "--quant") &&
        !hasValue) {
      error = arg + " expects a value";
    } else if (arg == "--out" || arg == "-o") {
      options.outDir = argv[++i];
    } else if (arg == "--seed") {
      number(arg, argv[++i], options.seed);
    } else if (arg == "--layers") {
      uint64_t layers = 0;
      if (number(arg, argv[++i], layers)) {
        if (layers < 2 || layers > 64)
          error = "--layers expects 2..64, found " + std::to_string(layers);
        options.layers = int64_t(layers);
      }
    } else if (arg == "--quant") {
      options.quant = argv[++i];
      if (options.quant != "fp8" && options.quant != "mxfp4")
        error = "--quant expects fp8 or mxfp4, found \"" + options.quant + "\"";
    } else if (!arg.empty() && arg[0] == '-') {
      error = "unknown option " + arg;
    } else if (options.family.empty()) {
      options.family = arg;
    } else {
      error = "unexpected argument " + arg;
    }
  }
  if (error.empty() && options.family.empty())
    error = "tiny expects a FAMILY";
  if (error.empty() && options.outDir.empty())
    error = "tiny expects --out DIR";
  if (!error.empty()) {
    std::cerr << "adapt: error: " << error << "\n" << kUsage;
    return kExitBadInput;
  }
  const std::vector<std::string> &families = tinyModelFamilies();
  if (std::find(families.begin(), families.end(), options.family) ==
      families.end()) {
    std::cerr << "adapt: error: unknown family '" << options.family
              << "'; known families:";
    for (const std::string &f : families)
      std::cerr << " " << f;
    std::cerr << "\n";
    return kExitBadInput;
  }
  Result<std::vector<std::string>> written = writeTinyModel(options);
  if (!written)
    return reportInputError(written.error());
  std::cout << "wrote tiny " << options.family << " model to " << options.outDir
            << " (" << written->size() << " files)\n";
  return kExitOk;
}

/// The model as IR plus what the passes found.
struct Analysis {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  GapReport report;
  std::optional<ModelFiles> files;
};

/// Reads PATH, imports it and (when \p runPasses) runs the gap pipeline.
/// Returns an exit code on failure, 0 on success.
int analyse(mlir::MLIRContext &context, const Options &opts, bool runPasses,
            Analysis &out) {
  out.report.source = opts.path;
  AnalysisContext analysisContext;
  std::optional<OpRegistry> registry;
  if (!opts.registry.empty()) {
    Result<OpRegistry> read = readOpRegistry(opts.registry);
    if (!read)
      return reportInputError(read.error());
    registry = std::move(read.value());
    analysisContext.registry = &*registry;
  }
  if (isOnnxPath(opts.path)) {
#ifdef ADAPT_WITH_ONNX
    Result<mlir::OwningOpRef<mlir::ModuleOp>> imported =
        importOnnxModel(context, opts.path, out.report);
    if (!imported)
      return reportInputError(imported.error());
    out.module = std::move(imported.value());
#else
    return reportInputError({opts.path, "", "this build of adapt has no ONNX support"});
#endif
  } else {
    Result<ModelFiles> files = loadModelFiles(opts.path);
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
    std::vector<ComponentDecl> components = declareModel(spec, probe);
    out.module = importModel(context, spec, components);
    out.report.modelType = spec.modelType;
    out.report.architecture = spec.architecture;
    out.report.family = spec.family;
    for (const UnknownKey &key : spec.unknownKeys)
      out.report.unknownConfigKeys.push_back({key.path, key.value});
    out.report.notes.insert(out.report.notes.end(), spec.notes.begin(),
                            spec.notes.end());
    for (const Assumption &a : spec.assumptions)
      out.report.assumptions.push_back({a.feature, a.basis, a.confirmBy, a.status});
    if (out.files->manifest) {
      analysisContext.manifest = &*out.files->manifest;
      analysisContext.headers = &out.files->headers;
    }
  }
  if (mlir::failed(mlir::verify(*out.module))) {
    std::cerr << "adapt: error: " << opts.path
              << ": the config describes an inconsistent model (see the "
                 "diagnostics above)\n";
    return kExitBadInput;
  }
  if (!runPasses)
    return 0;
  analysisContext.report = &out.report;
  mlir::PassManager pm(&context);
  buildGapPipeline(pm, analysisContext);
  if (mlir::failed(pm.run(*out.module))) {
    std::cerr << "adapt: error: " << opts.path << ": analysis failed\n";
    return kExitBadInput;
  }
  return 0;
}

/// Counts components by status and writes the one-line summary.
void summarise(GapReport &report) {
  std::map<GapStatus, int> counts;
  for (const ComponentGap &c : report.components)
    ++counts[c.status];
  report.summary = std::to_string(report.components.size()) +
                   " component variants: " +
                   std::to_string(counts[GapStatus::Supported]) + " supported, " +
                   std::to_string(counts[GapStatus::Partial]) + " partial, " +
                   std::to_string(counts[GapStatus::Missing]) + " missing";
  if (counts[GapStatus::Excluded])
    report.summary += ", " + std::to_string(counts[GapStatus::Excluded]) + " excluded from training";
  if (report.manifest.checked)
    report.summary += "; manifest: " +
                      std::to_string(report.manifest.issues.size()) + " issues";
}

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
                  << (l.ffn.numGroups > 1 ? ", group-limited" : "")
                  << (l.ffn.biasCorrection ? ", bias correction" : "") << "\n";
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

int run(int argc, char **argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
                    !std::strcmp(argv[1], "help"))) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (argc >= 2 && !std::strcmp(argv[1], "--version")) {
    std::cout << "adapt 0.1.0 (gaps schema 1)\n";
    return kExitOk;
  }
  if (argc >= 2 && !std::strcmp(argv[1], "tiny"))
    return runTiny(argc, argv);
  if (argc >= 2 && !std::strcmp(argv[1], "build"))
    return runBuildCommand(argc, argv);
  if (argc >= 2 && !std::strcmp(argv[1], "validate"))
    return runValidateCommand(argc, argv);
  if (argc >= 2 && !std::strcmp(argv[1], "serve"))
    return runServeCommand(argc, argv);
  if (argc >= 2 && !std::strcmp(argv[1], "generate"))
    return runGenerateCommand(argc, argv);
  if (argc >= 2 && !std::strcmp(argv[1], "review"))
    return runReviewCommand(argc, argv);
  Options opts;
  std::string error;
  if (!parseArgs(argc, argv, opts, error) ||
      (opts.command != "inspect" && opts.command != "gaps")) {
    if (error.empty())
      error = "unknown command '" + opts.command + "'";
    std::cerr << "adapt: error: " << error << "\n" << kUsage;
    return kExitBadInput;
  }
  mlir::MLIRContext context;
  context.getOrLoadDialect<AdaptDialect>();
  Analysis analysis;
  bool emitRaw = opts.command == "inspect" && opts.emit == "mlir";
  if (int code = analyse(context, opts, !emitRaw, analysis))
    return code;
  summarise(analysis.report);
  if (opts.command == "inspect") {
    if (opts.emit == "summary")
      printSummary(analysis);
    else
      analysis.module->print(llvm::outs());
    return kExitOk;
  }
  if (!writeGapReport(analysis.report, opts.out, error)) {
    std::cerr << "adapt: error: " << opts.out << ": " << error << "\n";
    return kExitBadInput;
  }
  std::cout << analysis.report.summary << "\n"
            << "wrote " << opts.out << "/gaps.json, gaps.md, gaps.html\n";
  if (analysis.report.manifest.checked)
    for (const ManifestIssue &issue : analysis.report.manifest.issues)
      if (issue.kind == "missing" || issue.kind == "shape" || issue.kind == "dtype") {
        std::cerr << "adapt: error: " << analysis.report.manifest.file << ": "
                  << issue.tensor << ": expected " << issue.expected << ", found "
                  << issue.found << " (the manifest disagrees with the config; "
                  << "all issues are in gaps.json)\n";
        return kExitBadInput;
      }
  return analysis.report.hasGaps() ? kExitGapsFound : kExitOk;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception &e) {
    std::cerr << "adapt: error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "adapt: error: unexpected failure\n";
  }
  return kExitBadInput;
}
