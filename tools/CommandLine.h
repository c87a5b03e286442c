//===- CommandLine.h - argument helpers every command shares ----*- C++ -*-===//
//
// The commands parse argv by hand (argv[1] is the command, flags follow).
// These helpers are the two steps all of them take the same way, so that a
// flag's value and a stray argument read alike in every command.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_TOOLS_COMMANDLINE_H
#define ADAPT_TOOLS_COMMANDLINE_H

#include <llvm/ADT/SmallString.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <initializer_list>
#include <string>

namespace adapt {

/// The path of the running adapt binary: the programs built beside it (the
/// runtime's build, the candidate checker, the venv) are found from there,
/// and the MCP tools run it as a child.
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

/// Stores the argument after the flag at argv[\p i] in \p into and moves \p i
/// onto it. False, with nothing taken, when the flag is the last argument.
inline bool takeFlagValue(int argc, char **argv, int &i, std::string &into) {
  if (i + 1 >= argc)
    return false;
  into = argv[++i];
  return true;
}

/// takeFlagValue that also says what is wrong: "FLAG expects a value" in
/// \p error when the flag at argv[\p i] is the last argument.
inline bool takeFlagValue(int argc, char **argv, int &i, std::string &into,
                          std::string &error) {
  if (takeFlagValue(argc, argv, i, into))
    return true;
  error = std::string(argv[i]) + " expects a value";
  return false;
}

/// Files \p arg, which no flag of the command claimed: the first argument
/// that is not a flag becomes \p positional. An unknown flag or a second
/// positional argument is a usage error, described in \p error.
inline bool takePositional(const std::string &arg, std::string &positional,
                           std::string &error) {
  if (!arg.empty() && arg[0] == '-') {
    error = "unknown option " + arg;
    return false;
  }
  if (!positional.empty()) {
    error = "unexpected argument " + arg;
    return false;
  }
  positional = arg;
  return true;
}

/// A flag of a command and the option it sets: a text flag's value (T is
/// std::string) or true for a switch (T is bool).
template <typename T> struct FlagTarget {
  const char *name; ///< "--out"
  T *into;
};

/// The option \p arg sets when it is one of \p flags, else null. Lets a
/// command list the flags that need no checking as one table:
/// findFlag<std::string>(arg, {{"--out", &out}, {"--registry", &registry}}).
template <typename T>
T *findFlag(const std::string &arg, std::initializer_list<FlagTarget<T>> flags) {
  for (const FlagTarget<T> &flag : flags)
    if (arg == flag.name)
      return flag.into;
  return nullptr;
}

} // namespace adapt

#endif // ADAPT_TOOLS_COMMANDLINE_H
