//===- CommandLine.h - argument helpers every command shares ----*- C++ -*-===//
//
// Every command declares its options as llvm::cl options of its own
// llvm::cl::SubCommand; tools/adapt.cpp parses argv once (parseCommandLine)
// and runs the chosen command, which reads them. Plus where the programs
// built beside adapt are found.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_TOOLS_COMMANDLINE_H
#define ADAPT_TOOLS_COMMANDLINE_H

#include <llvm/ADT/SmallString.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

namespace adapt {

/// The commands declare their options with llvm::cl (cl::opt, cl::sub, ...).
namespace cl = llvm::cl;

/// A flag of \p command parsed straight into \p field (cl::location): the
/// command's options struct holds the flags' defaults and their values, and
/// a flag is declared in one line.
template <typename T> struct FieldFlag : cl::opt<T, true> {
  FieldFlag(llvm::StringRef name, cl::SubCommand &command, T &field, const char *help)
      : cl::opt<T, true>(name, cl::sub(command), cl::location(field), cl::desc(help)) {}
};

/// The positional argument of \p command (its PATH), parsed into \p field.
template <typename T> struct PositionalField : cl::opt<T, true> {
  PositionalField(cl::SubCommand &command, T &field, const char *help)
      : cl::opt<T, true>(cl::Positional, cl::sub(command), cl::location(field), cl::desc(help)) {}
};

/// The path of the running adapt binary: the programs built beside it (the
/// runtime's build, the candidate checker, the venv) are found from there.
inline std::string adaptExecutable() {
  static const int anchor = 0;
  return llvm::sys::fs::getMainExecutable("adapt", const_cast<int *>(&anchor));
}

/// adaptExecutable()'s folder joined with \p parts, ".." resolved
/// (build/bin/adapt with {"..", "runtime"}: build/runtime).
inline std::string besideAdapt(std::initializer_list<const char *> parts) {
  llvm::SmallString<256> path(adaptExecutable());
  llvm::sys::path::remove_filename(path);
  for (const char *part : parts)
    llvm::sys::path::append(path, part);
  llvm::sys::path::remove_dots(path, /*remove_dot_dot=*/true);
  return std::string(path);
}

/// Parses argv (argv[1] names the command) into the options of that command,
/// declared in its file as llvm::cl options with cl::sub(the command's
/// llvm::cl::SubCommand). Every command is parsed by this one call, so a
/// flag's value, `--flag=value`, an unknown flag and a stray argument read
/// alike everywhere. False after printing "adapt: error: ..." lines and
/// \p usage (the command's usage lines) on stderr.
bool parseCommandLine(int argc, char **argv, const char *usage);

/// "" when \p value lies in \p lo..hi, else the usage error "FLAG expects an
/// integer in LO..HI, found VALUE" (llvm::cl parses the number; the range is
/// the command's).
std::string rangeError(const char *flag, int64_t value, int64_t lo, int64_t hi);

/// Prints "adapt: error: \p message" and \p usage; returns kExitBadInput, the
/// exit code of a usage error (for the checks a command makes after parsing).
int usageError(const std::string &message, const char *usage);

/// Runs \p command and returns its exit code; an exception escaping it is
/// reported as one "adapt: error: ..." line and exit 2, as on the command
/// line (main) and in the MCP tools (tools/McpCommands.cpp) alike. Flushes
/// std::cout and llvm::outs() after, so the output is out even when the
/// caller ends with _exit (a forked MCP call, agent/mcp/Isolated.h).
int runReportingFailures(const std::function<int()> &command);

} // namespace adapt

#endif // ADAPT_TOOLS_COMMANDLINE_H
