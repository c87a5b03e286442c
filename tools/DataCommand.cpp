//===- DataCommand.cpp - `adapt data` -------------------------------------===//
//
// Tokenisation belongs to the model's own tokenizer (tokenizer.json through
// Hugging Face `tokenizers`) and chat template (rendered by transformers'
// apply_chat_template), so this command runs scripts/adapt_data.py, which
// is compiled into the binary, with the reference venv's Python.
//
//===----------------------------------------------------------------------===//

#include "tools/DataCommand.h"
#include "tools/CommandLine.h"

#include "parser/InputError.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace adapt {

const char *const kDataUsage =
    "  adapt data IN.jsonl --model DIR --out OUT.jsonl [--format auto|text|chat|prompt_completion|ids]\n"
    "             [--max-len N] [--train-on-prompt] [--skip-bad]\n";

namespace {

const char *kDataScript =
#include "DataScript.inc"
    ;

/// The Python that has transformers: ADAPT_PYTHON, else .venv next to the
/// build folder this binary sits in (build/bin/adapt), else python3.
std::string pythonPath() {
  if (const char *env = std::getenv("ADAPT_PYTHON"); env && *env)
    return env;
  const std::string venv = besideAdapt({"..", "..", ".venv", "bin", "python"});
  if (llvm::sys::fs::can_execute(venv))
    return venv;
  llvm::ErrorOr<std::string> found = llvm::sys::findProgramByName("python3");
  return found ? *found : "";
}

} // namespace

int runDataCommand(int argc, char **argv) {
  const std::string python = pythonPath();
  if (python.empty()) {
    std::cerr << "adapt: error: adapt data needs Python with transformers: set ADAPT_PYTHON (the "
                 "reference venv, scripts/setup.sh)\n";
    return kExitBadInput;
  }
  std::vector<std::string> args = {python, "-c", kDataScript};
  for (int i = 2; i < argc; ++i)
    args.push_back(argv[i]);
  std::vector<llvm::StringRef> refs(args.begin(), args.end());
  std::string message;
  std::cout.flush();
  const int rc = llvm::sys::ExecuteAndWait(python, refs, std::nullopt, {}, 0, 0, &message);
  if (rc == kExitOk || rc == kExitBadInput)
    return rc;
  std::cerr << "adapt: error: " << python << ": the data step " << (rc < 0 ? "could not run: " + message
                                                                           : "ended with exit code " + std::to_string(rc))
            << "\n";
  return kExitBadInput;
}

} // namespace adapt
