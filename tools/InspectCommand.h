//===- InspectCommand.h - `adapt inspect` and `adapt gaps` ------*- C++ -*-===//
#ifndef ADAPT_TOOLS_INSPECTCOMMAND_H
#define ADAPT_TOOLS_INSPECTCOMMAND_H

#include <string>

namespace adapt {

/// What `adapt inspect` does, as its flags (or an MCP tool's arguments) say it.
struct InspectOptions {
  std::string path;
  std::string emit = "summary"; ///< summary, mlir or analysed
  std::string registry;         ///< an op registry in place of the built-in one
};

/// What `adapt gaps` does, as its flags (or an MCP tool's arguments) say it.
struct GapsOptions {
  std::string path, out, registry;
};

/// Usage lines of `adapt inspect` and `adapt gaps`, for the CLI's help text.
extern const char *const kInspectUsage;
extern const char *const kGapsUsage;

/// `adapt inspect PATH` with its flags parsed (parseCommandLine).
int runInspectCommand();
/// `adapt gaps PATH --out DIR` with its flags parsed (parseCommandLine).
int runGapsCommand();

/// Prints the model's summary, its imported IR or its analysed IR. Exit 0, or
/// 2 for bad input or options.
int inspectModel(const InspectOptions &options);

/// Writes gaps.json, gaps.md and gaps.html into options.out. Exit 0 nothing is
/// missing, 3 a component is missing or partial, 2 bad input or options.
int writeGaps(const GapsOptions &options);

} // namespace adapt

#endif // ADAPT_TOOLS_INSPECTCOMMAND_H
