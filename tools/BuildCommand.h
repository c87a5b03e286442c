//===- BuildCommand.h - `adapt build` ---------------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_BUILDCOMMAND_H
#define ADAPT_TOOLS_BUILDCOMMAND_H

namespace adapt {

/// Usage lines of `adapt build`, for the CLI's help text.
extern const char *const kBuildUsage;

/// `adapt build PATH --out DIR [...]`: analyse, inject LoRA, generate the
/// trainer project and (unless --no-compile) compile it to DIR/train.
/// Returns the process exit code (0, 2 bad input/usage, 3 gaps, 4 compile).
int runBuildCommand(int argc, char **argv);

} // namespace adapt

#endif // ADAPT_TOOLS_BUILDCOMMAND_H
