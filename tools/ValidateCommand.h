//===- ValidateCommand.h - `adapt validate` ---------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_VALIDATECOMMAND_H
#define ADAPT_TOOLS_VALIDATECOMMAND_H

#include <string>
#include <vector>

namespace adapt {

/// What `adapt validate` does, as its flags (or an MCP tool's arguments) say it.
struct ValidateOptions {
  std::string path, stage, out, fixture;
  std::string runtimeDir;           ///< empty: build/runtime beside the adapt binary
  std::vector<std::string> layouts; ///< parallel stage: the layouts to run; empty: every one
  int steps = 6;                    ///< parallel stage: training steps, 1..1000
};

/// Usage lines of `adapt validate`, for the CLI's help text.
extern const char *const kValidateUsage;

/// `adapt validate PATH --stage op|model|parallel|full --out DIR [...]`: one
/// stage of the validation ladder, records in DIR. Exit 0 every check passed
/// (or the stage is not run yet), 4 a check failed, 2 bad input.
int runValidateCommand();

/// The stage \p options name, with the same checks, records and exit codes.
int validateModel(ValidateOptions options);

} // namespace adapt

#endif // ADAPT_TOOLS_VALIDATECOMMAND_H
