//===- CommandLine.h - the runtime programs' one flag parser ----*- C++ -*-===//
//
// The generated trainers (TrainMain.cpp), adapt-op-check and
// adapt-candidate-check read their flags with this parser: "--flag VALUE",
// "--flag=VALUE" and switches, each flag at most once unless it is declared
// repeatable. Errors are RuntimeError exit 2 naming the flag, with the
// nearest known flag for a misspelt one. (The compiler side parses with
// llvm::cl, tools/CommandLine.h; the runtime has no LLVM.)
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_COMMANDLINE_H
#define ADAPT_RUNTIME_COMMANDLINE_H

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace adapt::rt {

/// The flags a program accepts ("--out"): those taking a value, the
/// switches, and which value flags may repeat (each occurrence kept).
struct FlagSpec {
  std::set<std::string> valued;
  std::set<std::string> switches;
  std::set<std::string> repeatable;
};

/// A parsed command line: each flag given and its values ("" for a switch).
struct ParsedFlags {
  std::map<std::string, std::vector<std::string>> values;

  bool has(const std::string &flag) const { return values.count(flag) != 0; }
  /// The flag's (last) value, or null when it was not given.
  const std::string *find(const std::string &flag) const;
  /// The flag's value, or \p fallback when it was not given.
  std::string text(const std::string &flag, const std::string &fallback = "") const;
  /// The flag's value as an integer in [\p min, \p max], or \p fallback when
  /// it was not given; bad input (exit 2) otherwise.
  int64_t integer(const std::string &flag, int64_t fallback, int64_t min,
                  int64_t max = INT64_MAX) const;
  /// The flag's value as one of \p choices, or \p fallback when not given.
  std::string choice(const std::string &flag, const std::string &fallback,
                     const std::set<std::string> &choices) const;
};

/// Parses argv[1..argc) against \p spec; throws RuntimeError (exit 2) for an
/// unknown flag (naming the nearest), a missing value, a switch given a
/// value, a repeated flag not declared repeatable, or a stray argument.
ParsedFlags parseFlags(int argc, char **argv, const FlagSpec &spec);

/// \p text as an integer >= \p min and <= \p max; \p flag names it in the error.
int64_t parseInteger(const std::string &flag, const std::string &text, int64_t min,
                     int64_t max = INT64_MAX);

/// \p text as a finite number >= \p min; \p flag names it in the error.
double parseNumber(const std::string &flag, const std::string &text, double min);

/// The flag of \p flags nearest to \p unknown by edit distance (at most 2
/// edits, or the one it starts), or "" when none is that near.
std::string nearestFlag(const std::string &unknown, const std::set<std::string> &flags);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_COMMANDLINE_H
