//===- BuildCommand.cpp - `adapt build` -----------------------------------===//
//
//   adapt build PATH --out DIR [--lora-targets a,b] [--lora-rank R]
//               [--lora-alpha A] [--lora-dropout P] [--rslora] [--lora-router] [--plan FILE]
//               [--no-compile] [--runtime-dir DIR] [--allow-gaps]
//               [--registry FILE]
//
// Reads the model folder like `gaps`, checks the manifest (exit 2 when it
// disagrees with the config), refuses models whose components the runtime
// has not implemented (exit 3, unless --allow-gaps), injects LoRA, generates
// the trainer project into DIR and compiles it against the runtime (exit 4
// when that fails).
//
//===----------------------------------------------------------------------===//

#include "tools/BuildCommand.h"
#include "tools/CommandLine.h"
#include "parser/AtomicFile.h"
#include "tools/ModelAnalysis.h"

#include "agent/Agent.h"
#include "agent/ReviewKey.h"
#include "codegen/EmitTrainer.h"
#include "ir/AdaptDialect.h"
#include "ir/ImportModel.h"
#include "models/WeightSchema.h"
#include "parser/ModelFolder.h"
#include "passes/Passes.h"
#include "passes/ReportWriter.h"

#include "mlir/IR/Diagnostics.h"
#include <nlohmann/json.hpp>
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"

#include <cctype>
#include <cstdlib>
#include <deque>
#include <map>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>
#include <unordered_set>

namespace adapt {

const char *const kBuildUsage =
    "  adapt build PATH --out DIR [--lora-targets a,b] [--lora-rank R]\n"
    "              [--lora-alpha A] [--lora-dropout P] [--rslora] [--lora-router] [--plan FILE]\n"
    "              [--no-compile] [--runtime-dir DIR] [--allow-gaps] [--registry FILE]\n";

namespace {

cl::SubCommand buildCommand("build", "Generate and compile a LoRA trainer for a model");
/// The flags, parsed straight into the options (cl::location); BuildOptions'
/// member defaults are the flags' defaults.
BuildOptions flags;
PositionalField<std::string> path(buildCommand, flags.path, "PATH");
FieldFlag<std::string> out("out", buildCommand, flags.out, "trainer project folder");
cl::alias outShort("o", cl::aliasopt(out));
cl::list<std::string> loraTargets("lora-targets", cl::sub(buildCommand), cl::CommaSeparated,
                                  cl::desc("module patterns, e.g. q_proj,v_proj or all-linear"));
FieldFlag<int64_t> loraRank("lora-rank", buildCommand, flags.rank, "1..65536");
FieldFlag<double> loraAlpha("lora-alpha", buildCommand, flags.alpha, "> 0");
FieldFlag<double> loraDropout("lora-dropout", buildCommand, flags.dropout, "in [0, 1)");
FieldFlag<bool> rslora("rslora", buildCommand, flags.rslora, "scale by alpha/sqrt(r)");
FieldFlag<bool> loraRouter("lora-router", buildCommand, flags.router, "adapt the MoE routers too");
FieldFlag<std::string> planPath("plan", buildCommand, flags.planPath,
    "plan.json whose layout becomes the default");
FieldFlag<bool> noCompile("no-compile", buildCommand, flags.noCompile, "write the project only");
FieldFlag<std::string> runtimeDir("runtime-dir", buildCommand, flags.runtimeDir, "the runtime build to link");
FieldFlag<bool> allowGaps("allow-gaps", buildCommand, flags.allowGaps,
    "build although components are not implemented");
FieldFlag<std::string> registry("registry", buildCommand, flags.registry,
    "an op registry in place of the built-in one");

/// The parsed flags as BuildOptions; false with \p error when --lora-targets
/// was given an empty list (buildTrainer checks the rest).
bool buildOptionsFromFlags(BuildOptions &o, std::string &error) {
  o = flags;
  for (const std::string &target : loraTargets)
    if (!target.empty())
      o.targets.push_back(target);
  if (loraTargets.getNumOccurrences() && o.targets.empty())
    error = "--lora-targets expects a comma-separated list of module patterns, e.g. "
            "q_proj,v_proj or all-linear";
  return error.empty();
}

/// "" when \p o can be built, else the usage error naming the flag whose
/// value is out of its range or missing.
std::string buildOptionsError(const BuildOptions &o) {
  std::string error = rangeError("--lora-rank", o.rank, 1, 65536);
  if (error.empty() && (!(o.alpha > 0) || o.alpha > 1e9))
    error = "--lora-alpha expects a number > 0";
  if (error.empty() && !(o.dropout >= 0 && o.dropout < 1))
    error = "--lora-dropout expects a number in [0, 1)";
  if (error.empty() && o.path.empty())
    error = "build expects a PATH";
  if (error.empty() && o.out.empty())
    error = "build expects --out DIR";
  return error;
}

/// Diagnostics as the CLI's one-line messages.
void printDiagnostic(mlir::Diagnostic &d) {
  const char *kind = d.getSeverity() == mlir::DiagnosticSeverity::Error ? "error"
                     : d.getSeverity() == mlir::DiagnosticSeverity::Warning
                         ? "warning"
                         : "note";
  std::cerr << "adapt: " << kind << ": " << d.str() << "\n";
}

/// The chosen layout of `adapt plan`'s plan.json at \p path, for the model
/// \p analysed (the plan must have been made for its depth and width).
/// False with a "field: expectation" \p error.
bool readPlanLayout(const std::string &path, const Analysis &analysed, ApplyPlanPassOptions &out,
                    std::string &error) {
  std::ifstream in(path);
  if (!in) {
    error = "cannot read the plan (adapt plan --out DIR writes DIR/plan.json)";
    return false;
  }
  const nlohmann::json plan = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  // Typed reads only: a field of the wrong type is bad input, never an exception.
  auto integer = [](const nlohmann::json &object, const char *key) -> int64_t {
    return object.is_object() && object.contains(key) && object[key].is_number_integer() ? object[key].get<int64_t>()
                                                                                        : -1;
  };
  if (!plan.is_object() || !plan.contains("schema_version") || plan["schema_version"] != "1") {
    error = "schema_version: expected a plan.json of schema 1 (adapt plan --out)";
    return false;
  }
  const nlohmann::json &chosen = plan.contains("chosen") ? plan["chosen"] : nlohmann::json();
  if (!chosen.is_object() || !chosen.contains("layout") || !chosen["layout"].is_object()) {
    error = "chosen: expected a layout; the plan found none that fits (its refusal says why)";
    return false;
  }
  const nlohmann::json &layout = chosen["layout"];
  int64_t sizes[5];
  const char *names[5] = {"tp", "ep", "pp", "cp", "dp"};
  for (int i = 0; i < 5; ++i) {
    const nlohmann::json &v = layout.contains(names[i]) ? layout[names[i]] : nlohmann::json();
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t(1) << 20)) {
      error = std::string("chosen.layout.") + names[i] + ": expected an integer >= 1";
      return false;
    }
    sizes[i] = v.get<int64_t>();
  }
  if (!layout.contains("recompute") || !layout["recompute"].is_boolean()) {
    error = "chosen.layout.recompute: expected true or false";
    return false;
  }
  const nlohmann::json &model = plan.contains("model") ? plan["model"] : nlohmann::json();
  const ModelSpec &spec = analysed.files->spec;
  if (integer(model, "layers") != int64_t(spec.layers.size()) || integer(model, "hidden") != spec.hidden) {
    error = "model: expected a plan for this model (" + std::to_string(spec.layers.size()) + " layers, hidden " +
            std::to_string(spec.hidden) + "), found one for " +
            (model.is_object() ? std::to_string(integer(model, "layers")) + " layers, hidden " +
                                     std::to_string(integer(model, "hidden"))
                               : std::string("no model"));
    return false;
  }
  out.tp = sizes[0];
  out.ep = sizes[1];
  out.pp = sizes[2];
  out.cp = sizes[3];
  out.dp = sizes[4];
  out.recompute = layout["recompute"].get<bool>();
  return true;
}

/// The last \p count lines of a file.
std::string tailOf(const std::string &path, size_t count) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > count)
      lines.pop_front();
  }
  std::string out;
  for (const std::string &l : lines)
    out += "  " + l + "\n";
  return out;
}

/// Runs one command with its output in \p log; true on exit status 0.
bool runLogged(const std::vector<std::string> &args, const std::string &log,
               std::string &error) {
  llvm::ErrorOr<std::string> program = llvm::sys::findProgramByName(args[0]);
  if (!program) {
    error = args[0] + " not found on PATH";
    return false;
  }
  std::vector<llvm::StringRef> refs(args.begin(), args.end());
  std::optional<llvm::StringRef> redirects[] = {llvm::StringRef(""),
                                                llvm::StringRef(log),
                                                llvm::StringRef(log)};
  std::string message;
  int rc = llvm::sys::ExecuteAndWait(*program, refs, std::nullopt, redirects, 0,
                                     0, &message);
  if (rc == 0)
    return true;
  error = args[0] + " " + args[1] + " failed" +
          (message.empty() ? " (exit " + std::to_string(rc) + ")" : ": " + message);
  return false;
}

/// \p path made absolute and without `.`/`..` components, symbolic links
/// kept (the project folder need not exist yet, so nothing is resolved).
std::string lexicalAbsolute(const std::string &path) {
  llvm::SmallString<256> out(path);
  llvm::sys::fs::make_absolute(out);
  llvm::sys::path::remove_dots(out, /*remove_dot_dot=*/true);
  return std::string(out);
}

/// The model folder PATH names (PATH itself, or the folder of a file).
std::string modelFolder(const std::string &path) {
  llvm::SmallString<256> dir(path);
  if (!llvm::sys::fs::is_directory(dir))
    llvm::sys::path::remove_filename(dir);
  return dir.empty() ? std::string(".") : std::string(dir);
}

/// The relative path from absolute folder \p from to absolute path \p to.
std::string relativePath(const std::string &from, const std::string &to) {
  std::vector<llvm::StringRef> a(llvm::sys::path::begin(from), llvm::sys::path::end(from));
  std::vector<llvm::StringRef> b(llvm::sys::path::begin(to), llvm::sys::path::end(to));
  size_t common = 0;
  while (common < a.size() && common < b.size() && a[common] == b[common])
    ++common;
  llvm::SmallString<256> out;
  for (size_t i = common; i < a.size(); ++i)
    llvm::sys::path::append(out, "..");
  for (size_t i = common; i < b.size(); ++i)
    llvm::sys::path::append(out, b[i]);
  return out.empty() ? std::string(".") : std::string(out);
}

/// Components the trainer runs whose registry entry is not implemented.
std::string runtimeGaps(const GapReport &report, const OpRegistry &registry) {
  std::string out;
  for (const ComponentGap &c : report.components) {
    if (c.op == "adapt.mtp" || c.op == "adapt.encoder")
      continue; // Not part of the trainer.
    const RegistryEntry *entry = registry.find(c.registryEntry);
    if (entry && entry->runsForward() && entry->runsBackward())
      continue;
    std::string status = !entry                ? "missing from the registry"
                         : !entry->runnable() ? entry->status
                                               : "without a forward and backward";
    std::string where = c.layers.empty() || c.layers.front() < 0
                            ? std::string()
                            : " (layers " + formatLayerRanges(c.layers) + ")";
    out += (out.empty() ? "" : ", ") + c.id + " is " + status + where;
  }
  return out;
}

/// The approved generated operators the trainer runs: for every component
/// whose registry entry names one, the source checked against the SHA-256
/// that was approved. False + \p error (exit 2) when a source is missing or
/// changed after approval, or its task cannot be wired into trainers yet.
bool collectGeneratedOps(const GapReport &report, const OpRegistry &registry,
                         std::vector<GeneratedOpUse> &uses, std::string &error) {
  for (const ComponentGap &c : report.components) {
    const RegistryEntry *entry = registry.find(c.registryEntry);
    if (!entry || entry->generated.source.empty())
      continue;
    const RegistryEntry::Generated &g = entry->generated;
    GeneratedOpUse use;
    if (!agent::readText(g.source, use.source)) {
      error = g.source + ": the approved source of " + c.id + " cannot be read";
      return false;
    }
    use.sha256 = agent::sha256Hex(use.source);
    std::string key, keyError;
    if (!agent::reviewKey(key, /*create=*/false, keyError) ||
        g.mac != agent::approvalMac(key, g.candidate, g.sha256, g.approvedBy)) {
      error = entry->id + ": no valid review MAC for this generated operator (" +
              (keyError.empty() ? "written or edited by hand, or approved on another machine"
                                : keyError) +
              "): approve it with adapt review and export the registry again";
      return false;
    }
    if (use.sha256 != g.sha256) {
      error = g.source + ": changed after approval (sha256 " + use.sha256.substr(0, 12) +
              ", approved " + g.sha256.substr(0, 12) + "): review and export it again";
      return false;
    }
    // Where the runtime calls each task's operator (runtime/GeneratedOps.h).
    static const std::map<std::pair<std::string, std::string>, std::string> sites = {
        {{"moe_routing", "adapt.moe"}, "ffn.generatedRouter"},
        {{"glu_activation", "adapt.moe"}, "ffn.generatedActivation"},
        {{"attention_core", "adapt.attention"}, "attention.generatedCore"},
        {{"rope", "adapt.attention"}, "attention.generatedRope"}};
    auto site = sites.find({g.task, c.op});
    if (site == sites.end()) {
      error = entry->id + ": a generated operator for task '" + g.task + "' on " + c.op +
              " cannot be wired into a trainer yet (moe_routing and glu_activation on "
              "adapt.moe, attention_core and rope on adapt.attention)";
      return false;
    }
    use.field = site->second;
    use.component = c.id;
    use.cuda = llvm::StringRef(g.source).ends_with(".cu");
    use.task = g.task;
    use.approvedBy = g.approvedBy;
    use.symbol = "adapt_generated_";
    for (char ch : c.id)
      use.symbol += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    for (int64_t layer : c.layers)
      if (layer >= 0)
        use.layers.push_back(layer);
    uses.push_back(std::move(use));
  }
  return true;
}

} // namespace

int runBuildCommand() {
  BuildOptions o;
  std::string error;
  if (!buildOptionsFromFlags(o, error))
    return usageError(error, kBuildUsage);
  return buildTrainer(o);
}

namespace {

/// Reads, imports and analyses PATH as `gaps` does into \p analysed; a
/// contradicting manifest is bad input, and (without --allow-gaps) a
/// component the runtime cannot run is a gap (exit 3). Returns the exit code.
int analyseForTraining(const BuildOptions &o, mlir::MLIRContext &context, Analysis &analysed) {
  std::cout << "== analysing " << o.path << std::endl;
  if (int code = analyseModel(context, {o.path, o.registry, /*runPasses=*/true}, analysed))
    return code;
  const OpRegistry &registry = analysed.opRegistry();
  const GapReport &report = analysed.report;
  if (const ManifestIssue *issue = contradictingManifestIssue(report)) {
    printManifestContradiction(report, *issue);
    return kExitBadInput;
  }
  int64_t extra = 0;
  for (const ManifestIssue &issue : report.manifest.issues)
    extra += issue.kind == "extra";
  if (extra > 0)
    std::cerr << "adapt: warning: " << report.manifest.file << ": " << extra
              << " tensor(s) belong to no component the config describes; the "
                 "trainer does not load them (`adapt gaps` lists them)\n";
  if (!o.allowGaps) {
    std::string gaps = runtimeGaps(report, registry);
    if (!gaps.empty()) {
      std::cerr << "adapt: error: " << o.path
                << ": the runtime cannot run this model yet: " << gaps
                << "; `adapt gaps` has the details, --allow-gaps generates the "
                   "trainer anyway\n";
      return kExitGapsFound;
    }
  }
  return kExitOk;
}

/// Marks the LoRA weights (adapt-inject-lora) and, with --plan, records the
/// plan's layout checked against this model. Returns the exit code.
int applyLoraAndPlan(const BuildOptions &o, mlir::MLIRContext &context, Analysis &analysed) {
  // LoRA.
  {
    InjectLoraPassOptions lora;
    lora.targets = o.targets;
    lora.rank = o.rank;
    lora.alpha = o.alpha;
    lora.dropout = o.dropout;
    lora.rslora = o.rslora;
    lora.router = o.router;
    mlir::PassManager pm(&context);
    populateLoraPipeline(pm, lora);
    if (mlir::failed(pm.run(*analysed.module)))
      return kExitBadInput; // The pass printed why.
  }

  // The plan's layout, checked against this model and recorded in the IR.
  if (!o.planPath.empty()) {
    ApplyPlanPassOptions plan;
    std::string error;
    if (!readPlanLayout(o.planPath, analysed, plan, error)) {
      std::cerr << "adapt: error: " << o.planPath << ": " << error << "\n";
      return kExitBadInput;
    }
    mlir::PassManager pm(&context);
    populatePlanPipeline(pm, plan);
    if (mlir::failed(pm.run(*analysed.module)))
      return kExitBadInput; // The pass printed why.
    std::cout << "== planned layout TP" << plan.tp << " EP" << plan.ep << " PP" << plan.pp << " CP" << plan.cp
              << " DP" << plan.dp << (plan.recompute ? " recompute" : "") << " (the trainer's default)"
              << std::endl;
  }
  return kExitOk;
}

/// Writes the trainer project (model.cpp, CMakeLists.txt, README.md and any
/// approved generated operators) into OUT; \p wroteOps receives how many
/// generated operators it holds. Returns the exit code.
int writeProject(const BuildOptions &o, const Analysis &analysed, size_t &wroteOps) {
  std::cout << "== generating " << o.out << std::endl;
  std::string error;
  TrainerOptions trainer;
  trainer.modelDir = relativePath(lexicalAbsolute(o.out), lexicalAbsolute(modelFolder(o.path)));
  if (!collectGeneratedOps(analysed.report, analysed.opRegistry(), trainer.generatedOps, error)) {
    std::cerr << "adapt: error: " << error << "\n";
    return kExitBadInput;
  }
  for (const GeneratedOpUse &use : trainer.generatedOps)
    std::cout << "   generated operator " << use.component << " (" << use.task
              << ", approved by " << use.approvedBy << ", sha256 "
              << use.sha256.substr(0, 12) << ")" << std::endl;
  std::vector<GeneratedFile> generated;
  if (!emitTrainer(*analysed.module, trainer, generated, error)) {
    std::cerr << "adapt: error: " << o.path << ": " << error << "\n";
    return kExitGapsFound;
  }
  if (std::error_code ec = llvm::sys::fs::create_directories(o.out)) {
    std::cerr << "adapt: error: " << o.out << ": cannot create the folder: "
              << ec.message() << "\n";
    return kExitBadInput;
  }
  for (const GeneratedFile &file : generated)
    if (!writeFileAtomically(o.out + "/" + file.name, file.contents, error, /*keepIdentical=*/true)) {
      std::cerr << "adapt: error: " << error << "\n";
      return kExitBadInput;
    }
  wroteOps = trainer.generatedOps.size();
  return kExitOk;
}

/// Configures and builds OUT against the runtime's build (--runtime-dir, else
/// the one beside adapt) and installs the binary as OUT/train. Returns the
/// exit code (4: it did not compile, with the log's last lines).
int compileProject(const BuildOptions &o) {
  std::string error;
  std::string runtimeDir = o.runtimeDir;
  if (runtimeDir.empty()) {
    runtimeDir = besideAdapt({"..", "runtime"});
  }
  if (!llvm::sys::fs::exists(runtimeDir + "/AdaptRuntimeConfig.cmake")) {
    std::cerr << "adapt: error: " << runtimeDir
              << ": no AdaptRuntimeConfig.cmake; build the runtime first "
                 "(bash scripts/setup.sh, or configure adapt with "
                 "-DADAPT_ENABLE_RUNTIME=ON and build), pass --runtime-dir DIR, "
                 "or --no-compile (the project in "
              << o.out << " is written)\n";
    return kExitBadInput;
  }
  llvm::SmallString<256> absRuntime(runtimeDir);
  llvm::sys::fs::make_absolute(absRuntime);
  std::string buildDir = o.out + "/build";
  llvm::sys::fs::create_directories(buildDir);
  std::cout << "== compiling (this takes ~30 s)" << std::endl;
  std::vector<std::string> configure = {
      "cmake", "-S", o.out, "-B", buildDir, "-DCMAKE_BUILD_TYPE=Release",
      "-DAdaptRuntime_DIR=" + std::string(absRuntime)};
  if (llvm::sys::findProgramByName("ninja"))
    configure.insert(configure.begin() + 1, {"-G", "Ninja"});
  std::string configureLog = buildDir + "/adapt-configure.log";
  std::string compileLog = buildDir + "/adapt-compile.log";
  if (!runLogged(configure, configureLog, error)) {
    std::cerr << "adapt: error: " << error << "; the last lines of "
              << configureLog << ":\n" << tailOf(configureLog, 25);
    return kExitCompileFailed;
  }
  if (!runLogged({"cmake", "--build", buildDir}, compileLog, error)) {
    std::cerr << "adapt: error: the generated trainer did not compile: " << error
              << "; the last lines of " << compileLog << ":\n"
              << tailOf(compileLog, 25);
    return kExitCompileFailed;
  }
  std::string binary = buildDir + "/train", target = o.out + "/train";
  std::string tmp = target + ".tmp." + std::to_string(::getpid());
  if (std::error_code ec = llvm::sys::fs::copy_file(binary, tmp)) {
    std::cerr << "adapt: error: " << binary << ": " << ec.message() << "\n";
    return kExitCompileFailed;
  }
  llvm::sys::fs::setPermissions(tmp, llvm::sys::fs::all_read |
                                         llvm::sys::fs::all_exe |
                                         llvm::sys::fs::owner_write);
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    std::cerr << "adapt: error: cannot move " << tmp << " to " << target << "\n";
    return kExitCompileFailed;
  }
  std::cout << "== built " << target << "\n";
  return kExitOk;
}

} // namespace

int buildTrainer(const BuildOptions &o) {
  if (std::string error = buildOptionsError(o); !error.empty())
    return usageError(error, kBuildUsage);
  if (isOnnxPath(o.path))
    return usageError(o.path + ": adapt build needs a Hugging Face model "
                      "folder (config.json and safetensors), not ONNX",
                      kBuildUsage);
  mlir::MLIRContext context;
  context.getOrLoadDialect<AdaptDialect>();
  mlir::ScopedDiagnosticHandler handler(&context, [](mlir::Diagnostic &d) {
    printDiagnostic(d);
    return mlir::success();
  });
  Analysis analysed;
  if (int code = analyseForTraining(o, context, analysed))
    return code;
  if (int code = applyLoraAndPlan(o, context, analysed))
    return code;
  size_t generatedOps = 0;
  if (int code = writeProject(o, analysed, generatedOps))
    return code;
  if (o.noCompile) {
    std::cout << "wrote " << o.out << "/model.cpp, CMakeLists.txt, README.md"
              << (generatedOps == 0 ? std::string()
                                    : ", generated_ops.cpp, " + std::to_string(generatedOps) +
                                          " approved source(s) in candidates/")
              << "\n";
    return kExitOk;
  }
  return compileProject(o);
}

} // namespace adapt
