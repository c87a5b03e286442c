//===- GenerateCommand.cpp - `adapt generate` -----------------------------===//
//
//   adapt generate PATH --out DIR [--registry FILE] [--endpoint URL]
//                  [--model NAME] [--api-key KEY] [--max-attempts N]
//                  [--max-tokens N] [--timeout S] [--test-timeout S]
//                  [--retries N] [--target libtorch|cuda] [--only ID]
//                  [--flag-speedup X]
//
// For every gap of PATH's gap report (PATH: a model folder/config, or a
// gaps.json): first the reuse rules (agent/ReuseRules.cpp); then, for what
// no rule covers and an op-stage task exists (agent/CandidateTasks.cpp:
// the task follows from the feature that makes the component a gap), the LLM loop
// (agent/LlmLoop.cpp) when an endpoint is configured. Everything is recorded
// under DIR (docs/agent.md): DIR/generate.json and DIR/candidates/<id>/.
// Candidates are proposals: only `adapt review --approve` lets them in.
//
//===----------------------------------------------------------------------===//

#include "tools/GenerateCommand.h"
#include "tools/CommandLine.h"

#include "agent/Agent.h"
#include "ir/AdaptDialect.h"
#include "passes/OpRegistry.h"
#include "passes/ReportWriter.h"
#include "tools/ModelAnalysis.h"
#include "parser/InputError.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <iterator>

namespace adapt {

const char *const kGenerateUsage =
    "  adapt generate PATH --out DIR [--registry FILE] [--endpoint URL] [--model NAME]\n"
    "                 [--api-key KEY] [--max-attempts N] [--max-tokens N] [--timeout S]\n"
    "                 [--test-timeout S] [--retries N] [--target libtorch|cuda] [--only ID]\n"
    "                 [--flag-speedup X]\n";

namespace {

using agent::Json;

std::string envOr(const char *a, const char *b = nullptr) {
  if (const char *v = std::getenv(a))
    return v;
  if (b)
    if (const char *v = std::getenv(b))
      return v;
  return "";
}

int usage(const std::string &message) { return usageError(message, kGenerateUsage); }

cl::SubCommand generateCommand("generate", "Propose a candidate operator for every gap");
/// The flags, parsed straight into the options (cl::location): LlmConfig's
/// member defaults are theirs; optionsFromFlags adds the environment's.
GenerateOptions flags;
PositionalField<std::string> pathFlag(generateCommand, flags.path, "PATH (a model or a gaps.json)");
FieldFlag<std::string> outFlag("out", generateCommand, flags.out, "candidates folder");
cl::alias outShort("o", cl::aliasopt(outFlag));
FieldFlag<std::string> registryFlag("registry", generateCommand, flags.registry,
    "an op registry in place of the built-in one");
FieldFlag<std::string> endpointFlag("endpoint", generateCommand, flags.llm.baseUrl, "OpenAI-compatible base URL");
FieldFlag<std::string> modelFlag("model", generateCommand, flags.llm.model, "the LLM's name");
FieldFlag<std::string> apiKeyFlag("api-key", generateCommand, flags.llm.apiKey, "the LLM's key");
FieldFlag<std::string> onlyFlag("only", generateCommand, flags.only, "one gap's id");
FieldFlag<std::string> targetFlag("target", generateCommand, flags.llm.target, "libtorch or cuda");
FieldFlag<int> maxAttemptsFlag("max-attempts", generateCommand, flags.llm.maxAttempts,
    "model turns per candidate, 1..100");
FieldFlag<int64_t> maxTokensFlag("max-tokens", generateCommand, flags.llm.maxTokens,
    "tokens per candidate, 1..100000000");
FieldFlag<int> timeoutFlag("timeout", generateCommand, flags.llm.requestTimeoutS, "seconds per request, 1..3600");
FieldFlag<int> testTimeoutFlag("test-timeout", generateCommand, flags.llm.testTimeoutS,
    "seconds per compile or test run, 1..3600");
FieldFlag<int> retriesFlag("retries", generateCommand, flags.llm.retries, "per request, 0..20");
FieldFlag<double> flagSpeedupFlag("flag-speedup", generateCommand, flags.llm.flagSpeedup,
    "a measured speedup above this is flagged");

/// The first IR line of the op whose variant is \p id, or "".
std::string irLineFor(const std::string &ir, const std::string &id) {
  std::string needle = "variant = \"" + id + "\"";
  size_t at = ir.find(needle);
  if (at == std::string::npos)
    return "";
  size_t begin = ir.rfind('\n', at), end = ir.find('\n', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  std::string line = ir.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  size_t first = line.find_first_not_of(' ');
  return first == std::string::npos ? line : line.substr(first);
}

/// The IR line as it reads once the candidate is in the library.
std::string irAfter(std::string line, const std::string &entryId) {
  for (const char *from : {"status = \"missing\"", "status = \"partial\""}) {
    size_t at = line.find(from);
    if (at != std::string::npos)
      line.replace(at, std::string(from).size(), "status = \"supported\"");
  }
  size_t g = line.find("gap_reasons = [");
  if (g != std::string::npos) {
    size_t end = line.find("], ", g);
    if (end != std::string::npos)
      line.erase(g, end + 3 - g);
  }
  return line + "  // registry entry " + entryId;
}

/// The options from the flags, and from the environment (llmFromEnvironment)
/// where no flag gives the endpoint, model or key.
GenerateOptions optionsFromFlags() {
  GenerateOptions o = flags;
  agent::LlmConfig environment = flags.llm;
  llmFromEnvironment(environment);
  if (!endpointFlag.getNumOccurrences())
    o.llm.baseUrl = environment.baseUrl;
  if (!modelFlag.getNumOccurrences())
    o.llm.model = environment.model;
  if (!apiKeyFlag.getNumOccurrences())
    o.llm.apiKey = environment.apiKey;
  o.llm.backoffMs = environment.backoffMs;
  return o;
}

/// "" when \p o can run, else the usage error naming the flag whose value is
/// out of its range or missing.
std::string optionsError(const GenerateOptions &o) {
  std::string error;
  for (const std::string &range : {rangeError("--max-attempts", o.llm.maxAttempts, 1, 100),
                                   rangeError("--timeout", o.llm.requestTimeoutS, 1, 3600),
                                   rangeError("--retries", o.llm.retries, 0, 20),
                                   rangeError("--test-timeout", o.llm.testTimeoutS, 1, 3600),
                                   rangeError("--max-tokens", o.llm.maxTokens, 1, 100000000)})
    if (error.empty())
      error = range;
  if (error.empty() && o.llm.target != "libtorch" && o.llm.target != "cuda")
    error = "--target expects libtorch or cuda, found \"" + o.llm.target + "\"";
  if (error.empty() && (!(o.llm.flagSpeedup > 0) || !std::isfinite(o.llm.flagSpeedup)))
    error = "--flag-speedup expects a positive number";
  if (error.empty() && o.path.empty())
    error = "generate expects a PATH";
  if (error.empty() && o.out.empty())
    error = "generate expects --out DIR";
  return error;
}

/// The registry the gaps are matched against (--registry, else the built-in
/// one), as JSON; false after printing why it is not one.
bool loadRegistry(const GenerateOptions &o, Json &registry) {
  std::string registryText = builtinOpRegistryText();
  if (!o.registry.empty() && !agent::readText(o.registry, registryText)) {
    std::cerr << "adapt: error: " << o.registry << ": cannot read the registry\n";
    return false;
  }
  registry = Json::parse(registryText, nullptr, false);
  if (registry.is_discarded() || !registry.contains("ops")) {
    std::cerr << "adapt: error: " << (o.registry.empty() ? "built-in registry" : o.registry)
              << ": not a registry (JSON with \"ops\")\n";
    return false;
  }
  return true;
}

/// The gap report of PATH: a gaps.json given (or a folder holding one), or
/// made here in-process as `adapt gaps` makes it, with the analysed IR the
/// candidates' records quote in \p ir (and OUT/ir-before.mlir). Returns the
/// exit code (0: \p gapsPath and \p report are set).
int loadGapReport(const GenerateOptions &o, std::string &gapsPath, Json &report, std::string &ir) {
  std::string error;
  bool isJson = llvm::StringRef(o.path).ends_with(".json") &&
                llvm::sys::path::filename(o.path) != "config.json";
  if (isJson) {
    gapsPath = o.path;
  } else if (llvm::sys::fs::exists(o.path + "/gaps.json") &&
             !llvm::sys::fs::exists(o.path + "/config.json")) {
    gapsPath = o.path + "/gaps.json";
  } else {
    // In-process: the same analysis as `adapt gaps`, and the analysed IR
    // that the candidates' records quote.
    mlir::MLIRContext context;
    context.getOrLoadDialect<AdaptDialect>();
    Analysis analysed;
    if (int code = analyseModel(context, {o.path, o.registry, /*runPasses=*/true}, analysed))
      return code;
    if (const ManifestIssue *issue = contradictingManifestIssue(analysed.report)) {
      printManifestContradiction(analysed.report, *issue);
      return kExitBadInput;
    }
    if (!writeGapReport(analysed.report, o.out + "/gaps", error)) {
      std::cerr << "adapt: error: " << o.out << "/gaps: " << error << "\n";
      return kExitBadInput;
    }
    gapsPath = o.out + "/gaps/gaps.json";
    llvm::raw_string_ostream irText(ir);
    analysed.module->print(irText);
    irText.flush();
    if (!agent::writeText(o.out + "/ir-before.mlir", ir, error)) {
      std::cerr << "adapt: error: " << o.out << "/ir-before.mlir: " << error << "\n";
      return kExitBadInput;
    }
  }
  std::string gapsText;
  if (!agent::readText(gapsPath, gapsText) ||
      (report = Json::parse(gapsText, nullptr, false)).is_discarded() ||
      !report.contains("components") || !report["components"].is_array()) {
    std::cerr << "adapt: error: " << gapsPath << ": not a gap report (gaps.json)\n";
    return kExitBadInput;
  }
  return kExitOk;
}

/// The checker LLM candidates are judged by: ADAPT_CANDIDATE_CHECK, else the
/// runtime build's adapt-candidate-check beside this binary.
agent::CandidateTools candidateTools() {
  agent::CandidateTools tools;
  const std::string checker = besideAdapt({"..", "runtime", "adapt-candidate-check"});
  if (const char *env = std::getenv("ADAPT_CANDIDATE_CHECK"))
    tools.checker = env;
  else if (llvm::sys::fs::exists(checker))
    tools.checker = std::string(checker);
  return tools;
}

/// The candidate record of the gap \p c: a reuse rule's, else "needs_llm"
/// (no task can validate one, or no endpoint), else the LLM loop's, its files
/// written under \p dir. Counts it in \p summary and sets \p covered when it
/// has a candidate; false after printing a write error.
bool candidateFor(const Json &c, const std::string &id, const std::string &dir, const std::string &irLine,
                  const Json &registry, const GenerateOptions &o, const agent::CandidateTools &tools,
                  Json &summary, Json &record, bool &covered) {
  std::string error;
  agent::ReuseMatch match;
  agent::CandidateTask task;
  covered = false;
  if (agent::matchReuseRules(c, registry, match)) {
    std::string entryId = match.registryEntry.value("id", "");
    record = {{"id", id},
              {"component", id},
              {"op", c.value("op", "")},
              {"features", c.value("features", Json::object())},
              {"kind", "reuse"},
              {"rule", match.rule},
              {"explanation", match.explanation},
              {"critical", agent::isCriticalCandidate(c.value("op", ""), match.rule)},
              {"status", "proposed"},
              {"reason", "reuse rule " + match.rule + " matched"},
              {"registry_entry_id", entryId},
              {"files", Json::array({"registry-entry.json", "adapter.txt"})},
              {"ir_before", irLine},
              {"ir_after", irLine.empty() ? "" : irAfter(irLine, entryId)},
              {"tokens", {{"prompt", 0}, {"completion", 0}, {"total", 0}}},
              {"flags", Json::array()}};
    if (!agent::writeText(dir + "/registry-entry.json", match.registryEntry.dump(2) + "\n",
                          error) ||
        !agent::writeText(dir + "/adapter.txt", match.adapter, error)) {
      std::cerr << "adapt: error: " << error << "\n";
      return false;
    }
    std::cout << "reuse     " << id << ": rule " << match.rule << " -> " << entryId << "\n";
    covered = true;
  } else if ((task = agent::chooseCandidateTask(c, registry, irLine)).name.empty()) {
    record = {{"id", id}, {"component", id}, {"op", c.value("op", "")},
              {"features", c.value("features", Json::object())}, {"kind", "llm"},
              {"rule", nullptr}, {"critical", agent::isCriticalOp(c.value("op", ""))},
              {"status", "needs_llm"}, {"files", Json::array()}, {"ir_before", irLine},
              {"task", nullptr},
              {"reason", "no reuse rule covers it; " + task.reason +
                             ": a candidate could not be validated, so none is asked for"}};
    summary["needs_llm"].push_back(id);
    std::cout << "needs LLM " << id << ": no reuse rule; " << task.reason << "\n";
  } else if (o.llm.baseUrl.empty()) {
    record = {{"id", id}, {"component", id}, {"op", c.value("op", "")},
              {"features", c.value("features", Json::object())}, {"kind", "llm"},
              {"rule", nullptr}, {"critical", agent::isCriticalOp(c.value("op", ""))},
              {"status", "needs_llm"}, {"files", Json::array()}, {"ir_before", irLine},
              {"task", task.name}, {"task_feature", task.feature},
              {"reason", "no reuse rule covers it; an LLM candidate needs an endpoint "
                         "(--endpoint or ADAPT_LLM_BASE_URL)"}};
    summary["needs_llm"].push_back(id);
    std::cout << "needs LLM " << id << ": no reuse rule; no endpoint configured\n";
  } else {
    std::cout << "llm       " << id << ": task " << task.name << " (" << task.feature
              << "), asking " << o.llm.model << " at " << o.llm.baseUrl << std::endl;
    record = agent::generateCandidate(c, task, irLine, o.llm, tools, dir);
    record["ir_before"] = irLine;
    if (record["status"] == "validated") {
      record["ir_after"] = irLine.empty() ? "" : irAfter(irLine, "candidate " + id);
      covered = true;
    } else {
      summary["failed"].push_back(id);
    }
    summary["tokens"] = summary["tokens"].get<int64_t>() + record["tokens"].value("total", 0);
    std::cout << "          " << record.value("status", "") << ": " << record.value("reason", "")
              << "\n";
  }
  return true;
}

} // namespace

void llmFromEnvironment(agent::LlmConfig &llm) {
  llm.baseUrl = envOr("ADAPT_LLM_BASE_URL", "OPENAI_BASE_URL");
  llm.model = envOr("ADAPT_LLM_MODEL");
  llm.apiKey = envOr("ADAPT_LLM_API_KEY", "OPENAI_API_KEY");
  if (std::string b = envOr("ADAPT_LLM_BACKOFF_MS"); !b.empty())
    llm.backoffMs = std::atoi(b.c_str());
}

int runGenerateCommand() { return generateCandidates(optionsFromFlags()); }

int generateCandidates(GenerateOptions o) {
  if (std::string error = optionsError(o); !error.empty())
    return usage(error);
  if (!o.llm.baseUrl.empty() && o.llm.model.empty())
    o.llm.model = "default";
  if (std::error_code ec = llvm::sys::fs::create_directories(o.out)) {
    std::cerr << "adapt: error: " << o.out << ": cannot create the folder: " << ec.message()
              << "\n";
    return kExitBadInput;
  }
  Json registry, report;
  std::string gapsPath, ir, error;
  if (!loadRegistry(o, registry))
    return kExitBadInput;
  if (int code = loadGapReport(o, gapsPath, report, ir))
    return code;
  const agent::CandidateTools tools = candidateTools();
  llvm::SmallString<256> absRegistry(o.registry);
  if (!o.registry.empty())
    llvm::sys::fs::make_absolute(absRegistry);
  Json summary = {{"source", o.path},
                  {"registry", o.registry.empty() ? Json(nullptr) : Json(std::string(absRegistry))},
                  {"gaps", gapsPath},
                  {"endpoint", o.llm.baseUrl.empty() ? Json(nullptr) : Json(o.llm.baseUrl)},
                  {"model", o.llm.model},
                  {"candidates", Json::array()},
                  {"needs_llm", Json::array()},
                  {"failed", Json::array()},
                  {"tokens", 0}};
  int gaps = 0, covered = 0;
  for (const Json &c : report["components"]) {
    std::string status = c.value("status", "");
    if (status != "missing" && status != "partial")
      continue;
    std::string id = c.value("id", "");
    if (!o.only.empty() && id != o.only)
      continue;
    ++gaps;
    const std::string dir = o.out + "/candidates/" + id;
    Json record;
    bool hasCandidate = false;
    if (!candidateFor(c, id, dir, irLineFor(ir, id), registry, o, tools, summary, record, hasCandidate))
      return kExitBadInput;
    covered += hasCandidate;
    record["gap_reasons"] = c.value("reasons", Json::array());
    record["content_sha256"] = agent::candidateContentHash(dir, record);
    if (!agent::writeText(dir + "/candidate.json", record.dump(2) + "\n", error)) {
      std::cerr << "adapt: error: " << error << "\n";
      return kExitBadInput;
    }
    summary["candidates"].push_back(
        {{"id", id}, {"status", record["status"]}, {"kind", record["kind"]},
         {"rule", record["rule"]}, {"critical", record["critical"]}});
  }
  if (!o.only.empty() && gaps == 0) {
    std::cerr << "adapt: error: --only " << o.only << ": no missing or partial component "
              << "with that id in " << gapsPath << "\n";
    return kExitBadInput;
  }
  if (!agent::writeText(o.out + "/generate.json", summary.dump(2) + "\n", error)) {
    std::cerr << "adapt: error: " << error << "\n";
    return kExitBadInput;
  }
  std::cout << gaps << " gaps: " << covered << " with a candidate, "
            << summary["needs_llm"].size() << " need an LLM, " << summary["failed"].size()
            << " failed; wrote " << o.out << "/generate.json; review with `adapt review "
            << o.out << "`\n";
  return covered == gaps ? kExitOk : kExitGapsFound;
}

} // namespace adapt
