//===- adapt.cpp - the adapt command line -----------------------------------===//
//
//   adapt inspect PATH [--emit summary|mlir|analysed]
//   adapt gaps PATH --out DIR [--registry FILE]
//   adapt tiny FAMILY --out DIR [--seed N] [--layers N] [--quant fp8|mxfp4]
//
// Exit codes (README.md, "Exit codes"): 0 ok / nothing missing, 2 bad input or
// usage, 3 gaps found. Nothing else on any input: every failure is caught
// here and reported as one line on stderr.
//
//===----------------------------------------------------------------------===//

#include "models/TinyModel.h"
#include "tools/BuildCommand.h"
#include "tools/CommandLine.h"
#include "tools/DataCommand.h"
#include "tools/GenerateCommand.h"
#include "tools/InspectCommand.h"
#include "tools/PlanCommand.h"
#include "tools/ReviewCommand.h"
#include "tools/ServeCommand.h"
#include "tools/ValidateCommand.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"
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

using namespace adapt;

namespace {

/// What `adapt --version` says.
constexpr const char *kVersion = "adapt 0.1.0 (gaps schema 1)";

/// What `adapt --help` says after the usage lines of every command.
constexpr const char *kUsageNotes = R"(
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

data tokenizes text, chat and prompt/completion records with the model's own
tokenizer and chat template into the trainer's JSONL, learning only the
assistant or completion tokens (docs/datasets.md).

plan chooses the parallel layout (TP, EP, PP, CP, DP, recomputation) for
training PATH's LoRA on N GPUs: memory per GPU by category and step time by
part for every legal layout, the fastest that fits first (docs/plan.md).

serve runs a Model Context Protocol server on http://ADDR:N/mcp (default
127.0.0.1, port 0 = any free port, printed on stdout) until SIGINT/SIGTERM.

exit codes: 0 success (gaps: nothing missing), 2 bad input or usage,
            3 gaps found (gaps; build: the runtime cannot run the model),
            4 the generated trainer did not compile (build); a validation
              check failed (validate: the record names the first divergence)
            generate: 0 every gap has a candidate, 3 some gap has none
            plan: 0 a layout fits, 3 none fits (why, and what would)
)";

/// Every command's usage lines, then kUsageNotes (defined with the command table).
std::string usageText();

constexpr const char *kTinyUsage =
    "  adapt tiny FAMILY --out DIR [--seed N] [--layers N] [--quant fp8|mxfp4]\n"
    "             [--config RELEASED_CONFIG.json [--manifest-only]]\n";

/// `tiny`'s options (runTiny), parsed straight into TinyModelOptions.
cl::SubCommand tinyCommand("tiny", "Write a tiny random-weight model of a family");
TinyModelOptions tinyOptions;
PositionalField<std::string> tinyFamily(tinyCommand, tinyOptions.family, "FAMILY");
FieldFlag<std::string> tinyOut("out", tinyCommand, tinyOptions.outDir, "output folder");
cl::alias tinyOutShort("o", cl::aliasopt(tinyOut));
FieldFlag<uint64_t> tinySeed("seed", tinyCommand, tinyOptions.seed, "random seed");
FieldFlag<int64_t> tinyLayers("layers", tinyCommand, tinyOptions.layers,
    "decoder layers, 2..64 (default: the family's)");
FieldFlag<std::string> tinyQuant("quant", tinyCommand, tinyOptions.quant, "fp8 or mxfp4");
FieldFlag<std::string> tinyConfig("config", tinyCommand, tinyOptions.configFile,
    "a released config.json to shrink");
FieldFlag<bool> tinyManifestOnly("manifest-only", tinyCommand, tinyOptions.manifestOnly,
    "with --config: the index and shard headers only");

/// An InputError as the one line users see.
int reportInputError(const InputError &error) {
  std::cerr << "adapt: error: " << error.message() << "\n";
  return kExitBadInput;
}

/// `adapt tiny FAMILY --out DIR [--seed N] [--layers N] [--quant Q]`.
int runTiny() {
  const TinyModelOptions &options = tinyOptions;
  if (tinyLayers.getNumOccurrences())
    if (std::string range = rangeError("--layers", options.layers, 2, 64); !range.empty())
      return usageError(range, kTinyUsage);
  if (tinyQuant.getNumOccurrences() && options.quant != "fp8" && options.quant != "mxfp4")
    return usageError("--quant expects fp8 or mxfp4, found \"" + options.quant + "\"", kTinyUsage);
  if (options.family.empty())
    return usageError("tiny expects a FAMILY", kTinyUsage);
  if (options.outDir.empty())
    return usageError("tiny expects --out DIR", kTinyUsage);
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

/// One command: its name, usage lines and entry point, which reads the
/// command's llvm::cl options (null for `data`, which hands its arguments
/// to its script unparsed).
struct Command {
  const char *name;
  const char *usage;
  int (*run)();
};

const Command kCommands[] = {
    {"inspect", kInspectUsage, runInspectCommand},
    {"gaps", kGapsUsage, runGapsCommand},
    {"tiny", kTinyUsage, runTiny},
    {"build", kBuildUsage, runBuildCommand},
    {"validate", kValidateUsage, runValidateCommand},
    {"serve", kServeUsage, runServeCommand},
    {"generate", kGenerateUsage, runGenerateCommand},
    {"review", kReviewUsage, runReviewCommand},
    {"plan", kPlanUsage, runPlanCommand},
    {"data", kDataUsage, nullptr},
};

/// The usage lines of every command, then the notes.
std::string usageText() {
  std::string text = "usage:\n";
  for (const Command &c : kCommands)
    text += c.usage;
  return text + "  adapt --help | --version\n" + kUsageNotes;
}

/// Levenshtein distance, for "did you mean" (LLVM's).
size_t editDistance(const std::string &a, const std::string &b) {
  return llvm::StringRef(a).edit_distance(b, /*AllowReplacements=*/true);
}

int run(int argc, char **argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
                    !std::strcmp(argv[1], "help"))) {
    std::cout << usageText();
    return kExitOk;
  }
  const Command *command = nullptr;
  for (const Command &c : kCommands)
    if (argc >= 2 && argv[1] == std::string(c.name))
      command = &c;
  if (argc >= 2 && !command && argv[1][0] != '-') {
    std::string nearest;
    for (const Command &c : kCommands)
      if (editDistance(argv[1], c.name) <= 2 && (nearest.empty() || editDistance(argv[1], c.name) <
                                                                        editDistance(argv[1], nearest)))
        nearest = c.name;
    std::cerr << "adapt: error: unknown command '" << argv[1] << "'"
              << (nearest.empty() ? "" : "; did you mean '" + nearest + "'?") << " (adapt --help lists them)\n";
    return kExitBadInput;
  }
  // `adapt COMMAND --help`: that command's usage, exit 0.
  for (int i = 2; command && i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::cout << "usage:\n" << command->usage;
      return kExitOk;
    }
  if (argc >= 2 && !std::strcmp(argv[1], "--version")) {
    std::cout << kVersion << "\n";
    return kExitOk;
  }
  cl::SetVersionPrinter([](llvm::raw_ostream &os) { os << kVersion << "\n"; });
  if (!command) {
    std::cerr << "adapt: error: expected a command\n" << usageText();
    return kExitBadInput;
  }
  // The data step's options are its script's (scripts/adapt_data.py).
  if (!command->run)
    return runDataCommand(argc, argv);
  if (!parseCommandLine(argc, argv, command->usage))
    return kExitBadInput;
  return command->run();
}

} // namespace

int main(int argc, char **argv) {
  return runReportingFailures([&] { return run(argc, argv); });
}
