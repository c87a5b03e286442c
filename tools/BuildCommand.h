//===- BuildCommand.h - `adapt build` ---------------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_BUILDCOMMAND_H
#define ADAPT_TOOLS_BUILDCOMMAND_H

#include <cstdint>
#include <string>
#include <vector>

namespace adapt {

/// What `adapt build` does, as its flags say it (the validation stages fill
/// it directly instead of assembling an argv).
struct BuildOptions {
  std::string path, out, runtimeDir, registry;
  std::string planPath; ///< --plan: plan.json whose layout becomes the trainer's default.
  std::vector<std::string> targets; ///< --lora-targets; empty: the default set.
  int64_t rank = 8;
  double alpha = 16.0, dropout = 0.0;
  bool rslora = false, router = false, noCompile = false, allowGaps = false;
};

/// Usage lines of `adapt build`, for the CLI's help text.
extern const char *const kBuildUsage;

/// `adapt build PATH --out DIR [...]`, with its flags parsed
/// (parseCommandLine): analyse, inject LoRA, generate the trainer project and
/// (unless --no-compile) compile it to DIR/train. Returns the process exit
/// code (0, 2 bad input/usage, 3 gaps, 4 compile).
int runBuildCommand();

/// `adapt build` with parsed options: the same steps and exit codes.
int buildTrainer(const BuildOptions &options);

} // namespace adapt

#endif // ADAPT_TOOLS_BUILDCOMMAND_H
