//===- CommandLine.cpp - one llvm::cl parse for every command --------------===//

#include "tools/CommandLine.h"

#include "parser/InputError.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

#include <iostream>
#include <vector>

namespace adapt {

namespace {

/// llvm::cl starts each message with its program name, argv[0]: parsing with
/// this one makes every message read "adapt: error: ...", including those it
/// writes to llvm::errs() itself (a flag without its value, a number that
/// does not parse).
constexpr const char *kMessagePrefix = "adapt: error";

/// \p text with every \p from replaced by \p to.
std::string replaceAll(std::string text, const std::string &from, const std::string &to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

} // namespace

bool parseCommandLine(int argc, char **argv, const char *usage) {
  // llvm::cl reads an argument "@FILE" as FILE's contents, split into more
  // arguments. An argument comes from MCP clients too, so that would read
  // (and echo in its errors) a file nobody named as input: refuse it.
  for (int i = 2; i < argc; ++i)
    if (argv[i][0] == '@') {
      std::cerr << "adapt: error: " << argv[i]
                << ": an argument starting with '@' is not read as a response file; write a "
                   "path as ./" << argv[i] << " and a value as --flag=" << argv[i] << "\nusage:\n"
                << usage;
      return false;
    }
  std::vector<const char *> args(argv, argv + argc);
  args[0] = kMessagePrefix;
  std::string messages;
  llvm::raw_string_ostream stream(messages);
  const bool parsed = llvm::cl::ParseCommandLineOptions(
      argc, args.data(), /*Overview=*/"", &stream, /*EnvVar=*/nullptr,
      /*LongOptionsUseDoubleDash=*/true);
  stream.flush();
  llvm::errs().flush();
  if (parsed)
    return true;
  // Its hints name the program by argv[0]: point them at the command's help.
  std::cerr << replaceAll(messages, std::string(kMessagePrefix) + " --help",
                          std::string("adapt ") + argv[1] + " --help")
            << "usage:\n"
            << usage;
  return false;
}

std::string rangeError(const char *flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi)
    return "";
  return std::string(flag) + " expects an integer in " + std::to_string(lo) + ".." +
         std::to_string(hi) + ", found " + std::to_string(value);
}

int usageError(const std::string &message, const char *usage) {
  std::cerr << "adapt: error: " << message << "\nusage:\n" << usage;
  return kExitBadInput;
}

int runReportingFailures(const std::function<int()> &command) {
  int code = kExitBadInput;
  try {
    code = command();
  } catch (const std::exception &e) {
    std::cerr << "adapt: error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "adapt: error: unexpected failure\n";
  }
  std::cout.flush();
  llvm::outs().flush();
  return code;
}

} // namespace adapt
