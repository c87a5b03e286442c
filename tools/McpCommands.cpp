//===- McpCommands.cpp - the commands behind the MCP tools ---------------===//
//
// One function per tool: the tool's arguments (already checked against its
// input schema and confined to the server's roots) become the command's
// options. The argument names are the input schemas' in
// agent/mcp/AdaptTools.cpp; the checks and messages are the commands' own.
//
//===----------------------------------------------------------------------===//

#include "tools/McpCommands.h"

#include "tools/BuildCommand.h"
#include "tools/CommandLine.h"
#include "tools/GenerateCommand.h"
#include "tools/InspectCommand.h"
#include "tools/ValidateCommand.h"

namespace adapt {
namespace {

using mcp::json;

/// Sets \p into to ARGUMENTS[KEY] when the tool was given it.
template <typename T> void optional(const json &arguments, const char *key, T &into) {
  if (arguments.contains(key))
    into = arguments[key].get<T>();
}

/// \p command run as main runs it (runReportingFailures).
mcp::AdaptCommands::Command reporting(std::function<int(const json &)> command) {
  return [command = std::move(command)](const json &arguments) {
    return runReportingFailures([&] { return command(arguments); });
  };
}

int inspect(const json &arguments) {
  InspectOptions o;
  o.path = arguments["path"];
  optional(arguments, "emit", o.emit);
  optional(arguments, "registry", o.registry);
  return inspectModel(o);
}

int gaps(const json &arguments) {
  GapsOptions o;
  o.path = arguments["path"];
  o.out = arguments["out"];
  optional(arguments, "registry", o.registry);
  return writeGaps(o);
}

int build(const json &arguments) {
  BuildOptions o;
  o.path = arguments["path"];
  o.out = arguments["out"];
  optional(arguments, "loraTargets", o.targets);
  optional(arguments, "loraRank", o.rank);
  optional(arguments, "loraAlpha", o.alpha);
  optional(arguments, "loraDropout", o.dropout);
  optional(arguments, "rslora", o.rslora);
  optional(arguments, "loraRouter", o.router);
  optional(arguments, "noCompile", o.noCompile);
  optional(arguments, "allowGaps", o.allowGaps);
  optional(arguments, "runtimeDir", o.runtimeDir);
  optional(arguments, "registry", o.registry);
  return buildTrainer(o);
}

int validate(const json &arguments) {
  ValidateOptions o;
  o.path = arguments["path"];
  o.stage = arguments["stage"];
  o.out = arguments["out"];
  optional(arguments, "fixture", o.fixture);
  optional(arguments, "runtimeDir", o.runtimeDir);
  return validateModel(std::move(o));
}

/// The LLM's endpoint, model and key are the server's environment's only: no
/// tool argument names them (the schema refuses unknown arguments).
int generate(const json &arguments) {
  GenerateOptions o;
  o.path = arguments["path"];
  o.out = arguments["out"];
  llmFromEnvironment(o.llm);
  optional(arguments, "registry", o.registry);
  optional(arguments, "maxAttempts", o.llm.maxAttempts);
  optional(arguments, "target", o.llm.target);
  optional(arguments, "flagSpeedup", o.llm.flagSpeedup);
  optional(arguments, "only", o.only);
  return generateCandidates(std::move(o));
}

} // namespace

mcp::AdaptCommands adaptCommandsForMcp() {
  return {reporting(inspect), reporting(gaps), reporting(build), reporting(validate),
          reporting(generate)};
}

} // namespace adapt
