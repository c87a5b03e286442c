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

#include <type_traits>
#include <variant>

namespace adapt {
namespace {

using mcp::json;

/// Where one tool argument goes in its command's options.
using Field = std::variant<std::string *, std::vector<std::string> *, int64_t *, int *, double *, bool *>;

/// Copies each argument the tool was given into its field (the schema check
/// has made sure of its type and bounds; a required one is always there).
void fill(const json &arguments, std::initializer_list<std::pair<const char *, Field>> fields) {
  for (const auto &[key, field] : fields)
    if (arguments.contains(key))
      std::visit([&](auto *into) { *into = arguments[key].get<std::remove_pointer_t<decltype(into)>>(); },
                 field);
}

/// \p command run as main runs it (runReportingFailures).
mcp::AdaptCommands::Command reporting(std::function<int(const json &)> command) {
  return [command = std::move(command)](const json &arguments) {
    return runReportingFailures([&] { return command(arguments); });
  };
}

int inspect(const json &arguments) {
  InspectOptions o;
  fill(arguments, {{"path", &o.path}, {"emit", &o.emit}, {"registry", &o.registry}});
  return inspectModel(o);
}

int gaps(const json &arguments) {
  GapsOptions o;
  fill(arguments, {{"path", &o.path}, {"out", &o.out}, {"registry", &o.registry}});
  return writeGaps(o);
}

int build(const json &arguments) {
  BuildOptions o;
  fill(arguments, {{"path", &o.path}, {"out", &o.out}, {"loraTargets", &o.targets}, {"loraRank", &o.rank},
                   {"loraAlpha", &o.alpha}, {"loraDropout", &o.dropout}, {"rslora", &o.rslora},
                   {"loraRouter", &o.router}, {"noCompile", &o.noCompile}, {"allowGaps", &o.allowGaps},
                   {"runtimeDir", &o.runtimeDir}, {"registry", &o.registry}});
  return buildTrainer(o);
}

int validate(const json &arguments) {
  ValidateOptions o;
  fill(arguments, {{"path", &o.path}, {"stage", &o.stage}, {"out", &o.out}, {"fixture", &o.fixture},
                   {"runtimeDir", &o.runtimeDir}, {"layouts", &o.layouts}, {"steps", &o.steps}});
  return validateModel(std::move(o));
}

/// The LLM's endpoint, model and key are the server's environment's only: no
/// tool argument names them (the schema refuses unknown arguments).
int generate(const json &arguments) {
  GenerateOptions o;
  llmFromEnvironment(o.llm);
  fill(arguments, {{"path", &o.path}, {"out", &o.out}, {"registry", &o.registry},
                   {"maxAttempts", &o.llm.maxAttempts}, {"target", &o.llm.target},
                   {"flagSpeedup", &o.llm.flagSpeedup}, {"only", &o.only}});
  return generateCandidates(std::move(o));
}

} // namespace

mcp::AdaptCommands adaptCommandsForMcp() {
  return {reporting(inspect), reporting(gaps), reporting(build), reporting(validate),
          reporting(generate)};
}

} // namespace adapt
