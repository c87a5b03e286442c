//===- InputError.h - errors a user can cause with bad input ---*- C++ -*-===//
//
// Every reader in parser/ reports bad input as one InputError value naming the
// file, the field and what was expected. The CLI turns it into one line on
// stderr and exit code 2 (README.md, "Exit codes").
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_INPUTERROR_H
#define ADAPT_PARSER_INPUTERROR_H

#include <string>
#include <utility>
#include <variant>

namespace adapt {

/// Documented process exit codes of every `adapt` command.
enum ExitCode : int {
  kExitOk = 0,          ///< Success; for `gaps`: nothing is missing.
  kExitBadInput = 2,    ///< Input files are malformed, missing or inconsistent.
  kExitGapsFound = 3,   ///< `gaps`: at least one component is partial/missing.
  kExitCheckFailed = 4, ///< `validate`: a numerical comparison failed.
  /// `build`: the generated trainer did not compile (the same number as a
  /// failed check: the command's own work, not its input, went wrong).
  kExitCompileFailed = 4,
};

/// One problem with the user's input: which file, which field, what was
/// expected instead of what was found.
struct InputError {
  std::string file;     ///< Path of the offending file ("" when not a file).
  std::string field;    ///< JSON path, tensor name or byte range.
  std::string expected; ///< What a valid file has there, and what it had.

  /// "FILE: FIELD: EXPECTED" as printed by the CLI.
  std::string message() const {
    std::string out = file.empty() ? std::string("<input>") : file;
    if (!field.empty())
      out += ": " + field;
    out += ": " + expected;
    return out;
  }
};

/// A value or the InputError explaining why there is none. Small on purpose:
/// parser/ does not depend on LLVM so that fuzz targets stay light.
template <typename T> class Result {
public:
  Result(T value) : state(std::move(value)) {}
  Result(InputError error) : state(std::move(error)) {}
  bool ok() const { return state.index() == 0; }
  explicit operator bool() const { return ok(); }
  T &value() { return std::get<0>(state); }
  const T &value() const { return std::get<0>(state); }
  T &operator*() { return value(); }
  T *operator->() { return &value(); }
  const InputError &error() const { return std::get<1>(state); }

private:
  std::variant<T, InputError> state;
};

} // namespace adapt

#endif // ADAPT_PARSER_INPUTERROR_H
