//===- ValidateCommand.cpp - `adapt validate` -----------------------------===//
//
// The validation ladder's driver. Each stage runs where its code lives:
//  - op: the runtime's `adapt-op-check` (every op variant against float64
//    references, forward and backward, fp32 and bf16, several seeds);
//  - model: `adapt build` with the fixture's LoRA targets, then the
//    generated trainer's `--validate FIXTURE` (logits, loss, adapter
//    gradients, per-layer activations against transformers + PEFT);
//  - parallel: tools/ParallelStage.h (layouts as processes against one);
//  - full: recorded as not run until the parallel stage covers every layout.
// A model is promoted only over a passing op record for the same runtime
// library (SHA-256), so a record never vouches for other code.
//
//===----------------------------------------------------------------------===//

#include "tools/ValidateCommand.h"

#include "parser/InputError.h"
#include "tools/BuildCommand.h"
#include "tools/CommandLine.h"
#include "tools/ParallelStage.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SHA256.h"
#include "llvm/ADT/StringExtras.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <iostream>
#include <string>
#include <vector>

namespace adapt {

const char *const kValidateUsage =
    "  adapt validate PATH --stage op|model|parallel|full --out DIR\n"
    "                 [--fixture DIR] [--runtime-dir DIR] [--layouts L1,L2] [--steps N]\n";

namespace {

cl::SubCommand validateCommand("validate", "Run a stage of the validation ladder");
/// The flags, parsed straight into the options (cl::location); --layouts is
/// copied in by runValidateCommand.
ValidateOptions flags;
PositionalField<std::string> pathFlag(validateCommand, flags.path, "PATH");
FieldFlag<std::string> stageFlag("stage", validateCommand, flags.stage, "op, model, parallel or full");
FieldFlag<std::string> outFlag("out", validateCommand, flags.out, "record folder");
FieldFlag<std::string> fixtureFlag("fixture", validateCommand, flags.fixture,
    "reference fixture folder (model stage)");
FieldFlag<std::string> runtimeDirFlag("runtime-dir", validateCommand, flags.runtimeDir, "the runtime build");
cl::list<std::string> layoutsFlag("layouts", cl::sub(validateCommand), cl::CommaSeparated,
                                  cl::desc("parallel stage: the layouts to run"));
FieldFlag<int> stepsFlag("steps", validateCommand, flags.steps, "parallel stage: training steps, 1..1000");

int usage(const std::string &error) { return usageError(error, kValidateUsage); }

/// SHA-256 of a file as hex, "" when unreadable.
std::string sha256Of(const std::string &path) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer)
    return "";
  std::array<uint8_t, 32> digest = llvm::SHA256::hash(llvm::arrayRefFromStringRef((*buffer)->getBuffer()));
  return llvm::toHex(digest, /*LowerCase=*/true);
}

/// Runs \p args with stdout/stderr shared; returns the exit code (-1 when
/// it could not start).
int runProgram(const std::vector<std::string> &args) {
  std::cout.flush(); // our lines before the child's
  std::vector<llvm::StringRef> refs(args.begin(), args.end());
  std::string message;
  int rc = llvm::sys::ExecuteAndWait(args[0], refs, std::nullopt, {}, 0, 0, &message);
  if (rc < 0)
    std::cerr << "adapt: error: " << args[0] << ": " << message << "\n";
  return rc;
}

/// Records a stage that cannot run yet.
int notRun(const ValidateOptions &o, const std::string &reason) {
  nlohmann::ordered_json record = {{"stage", o.stage}, {"status", "not run"}, {"passed", nullptr},
                                   {"model", o.path}, {"reason", reason}};
  llvm::sys::fs::create_directories(o.out);
  std::ofstream(o.out + "/" + o.stage + "-stage.json") << record.dump(2) << "\n";
  std::ofstream(o.out + "/" + o.stage + "-stage.md")
      << "# " << o.stage << " stage: not run\n\n" << reason << "\n";
  std::cout << o.stage << " stage: not run (" << reason << ")\n";
  return kExitOk;
}

int runModelStage(const ValidateOptions &o) {
  if (o.fixture.empty())
    return usage("--stage model needs --fixture DIR (validation/fixtures/<family>)");
  std::string fixtureMeta = o.fixture + "/fixture.json";
  std::ifstream metaIn(fixtureMeta);
  if (!metaIn) {
    std::cerr << "adapt: error: " << fixtureMeta
              << ": fixture: expected a reference fixture (validation/make_fixture.py) here\n";
    return kExitBadInput;
  }
  nlohmann::json meta = nlohmann::json::parse(metaIn, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.contains("lora")) {
    std::cerr << "adapt: error: " << fixtureMeta << ": lora: expected the fixture's LoRA settings\n";
    return kExitBadInput;
  }
  // Promotion: a passing op stage for this very runtime library.
  std::string library = o.runtimeDir + "/libadapt_runtime.a";
  std::string opRecord = o.out + "/op-stage.json";
  std::ifstream opIn(opRecord);
  nlohmann::json op = opIn ? nlohmann::json::parse(opIn, nullptr, false) : nlohmann::json();
  std::string recorded = op.is_object() && op.contains("code") ? op["code"].value("sha256", "") : "";
  if (!op.is_object() || op.value("passed", false) != true || recorded != sha256Of(library)) {
    std::cerr << "adapt: error: " << opRecord << ": code.sha256: expected a passing op-stage record for "
              << library << " ("
              << (!op.is_object() ? "none found" : recorded != sha256Of(library) ? "record from other code" : "it failed")
              << "); run `adapt validate PATH --stage op --out " << o.out << "` first\n";
    return kExitBadInput;
  }
  // A record of some checks only (adapt-op-check --only / --dtype) vouches for those alone.
  const bool partial = (op.contains("only") && op["only"] != "") || (op.contains("dtype") && op["dtype"] != "both");
  if (partial) {
    std::cerr << "adapt: error: " << opRecord << ": only: expected a record of every op check (this one ran "
              << (op.contains("only") && op["only"] != "" ? "--only " + op["only"].dump() : "--dtype " + op["dtype"].dump())
              << "); run `adapt validate PATH --stage op --out " << o.out << "` first\n";
    return kExitBadInput;
  }
  // Build the trainer with the fixture's adapter.
  const nlohmann::json &lora = meta["lora"];
  std::string targets;
  for (const auto &t : lora.value("target_modules", nlohmann::json::array()))
    targets += (targets.empty() ? "" : ",") + t.get<std::string>();
  if (!lora.value("target_parameters", nlohmann::json::array()).empty())
    targets += std::string(targets.empty() ? "" : ",") + "experts";
  std::string trainerDir = o.out + "/trainer";
  // The fixture is input like any other: its settings are checked as the
  // build command's flags would be.
  const nlohmann::json rank = lora.contains("rank") ? lora["rank"] : nlohmann::json(8);
  const nlohmann::json alpha = lora.contains("alpha") ? lora["alpha"] : nlohmann::json(16.0);
  std::string bad;
  if (targets.empty())
    bad = "lora.target_modules: expected at least one target module or target parameter";
  else if (!rank.is_number_integer() || rank.get<int64_t>() < 1 || rank.get<int64_t>() > 65536)
    bad = "lora.rank: expected an integer in 1..65536";
  else if (!alpha.is_number() || !(alpha.get<double>() > 0) || alpha.get<double>() > 1e9)
    bad = "lora.alpha: expected a number > 0";
  if (!bad.empty()) {
    std::cerr << "adapt: error: " << fixtureMeta << ": " << bad << "\n";
    return kExitBadInput;
  }
  BuildOptions build;
  build.path = o.path;
  build.out = trainerDir;
  build.runtimeDir = o.runtimeDir;
  std::stringstream list(targets);
  for (std::string item; std::getline(list, item, ',');)
    build.targets.push_back(item);
  build.rank = rank.get<int64_t>();
  build.alpha = alpha.get<double>();
  std::cout << "== building the trainer with the fixture's LoRA (" << targets << ")\n";
  if (int rc = buildTrainer(build); rc != kExitOk)
    return rc;
  std::cout << "== model stage against " << o.fixture << "\n";
  int rc = runProgram({trainerDir + "/train", "--validate", o.fixture, "--out", o.out});
  if (rc == 0 || rc == kExitCheckFailed || rc == kExitBadInput)
    return rc;
  std::cerr << "adapt: error: the trainer ended with exit code " << rc << "\n";
  return kExitCheckFailed;
}

} // namespace

int runValidateCommand() {
  ValidateOptions o = flags;
  for (const std::string &layout : layoutsFlag)
    if (!layout.empty())
      o.layouts.push_back(layout);
  return validateModel(std::move(o));
}

int validateModel(ValidateOptions o) {
  if (o.path.empty() || o.out.empty() || o.stage.empty())
    return usage("validate expects PATH, --stage and --out DIR");
  if (!llvm::sys::fs::exists(o.path)) {
    std::cerr << "adapt: error: " << o.path << ": expected a model folder\n";
    return kExitBadInput;
  }
  if (o.runtimeDir.empty()) {
    o.runtimeDir = besideAdapt({"..", "runtime"});
  }
  if (o.stage == "parallel") {
    ParallelStageOptions parallel{o.path, o.out, o.runtimeDir, o.layouts, o.steps};
    if (std::string range = rangeError("--steps", parallel.steps, 1, 1000); !range.empty())
      return usage(range);
    return runParallelStage(parallel);
  }
  if (o.stage == "full")
    return notRun(o, "needs the parallel stage to pass first, at the model's real size");
  if (o.stage != "op" && o.stage != "model")
    return usage("--stage expects op, model, parallel or full, got '" + o.stage + "'");
  std::string checker = o.runtimeDir + "/adapt-op-check";
  if (!llvm::sys::fs::can_execute(checker)) {
    std::cerr << "adapt: error: " << checker << ": expected the runtime build (bash scripts/setup.sh, or --runtime-dir DIR)\n";
    return kExitBadInput;
  }
  if (o.stage == "op") {
    int rc = runProgram({checker, "--out", o.out});
    return rc == kExitOk || rc == kExitCheckFailed || rc == kExitBadInput ? rc : kExitCheckFailed;
  }
  return runModelStage(o);
}

} // namespace adapt
