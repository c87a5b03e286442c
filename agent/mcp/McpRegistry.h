//===- McpRegistry.h - what an MCP server offers ----------------*- C++ -*-===//
//
// The tools, resources and prompts `adapt serve` exposes, as plain data plus
// handlers. Protocol-only: no MLIR or LibTorch headers, so it compiles fast.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_MCPREGISTRY_H
#define ADAPT_AGENT_MCP_MCPREGISTRY_H

#include "agent/mcp/Workspace.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace adapt::mcp {

using json = nlohmann::json;

/// A JSON-RPC error a handler raises on purpose (answered as a JSON-RPC
/// error, never as a tool result).
struct RpcError : std::runtime_error {
  RpcError(int code, const std::string &message, json data = nullptr)
      : std::runtime_error(message), code(code), data(std::move(data)) {}
  int code;
  json data;
};

/// JSON-RPC and MCP error codes.
enum ErrorCode : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
  kResourceNotFound = -32002,
  kHeaderMismatch = -32020,
  kMissingClientCapability = -32021,
};

/// What a running tools/call can do besides returning: report progress, log,
/// ask the client something, and notice that the client cancelled it.
class CallContext {
public:
  virtual ~CallContext() = default;
  /// Sends notifications/progress when the caller asked for it (a progress
  /// token); otherwise does nothing.
  virtual void progress(double progress, std::optional<double> total,
                        const std::string &message) = 0;
  /// Sends notifications/message at LEVEL if the client's level allows it.
  virtual void log(const std::string &level, const json &data) = 0;
  /// Sends a request to the client (sampling/createMessage, elicitation/
  /// create, roots/list) on the call's stream and waits for its result.
  /// Throws RpcError when the client answers with an error or cannot be asked.
  virtual json requestClient(const std::string &method, const json &params) = 0;
  /// True once the client cancelled the call or went away.
  virtual bool cancelled() const = 0;
  /// The client capabilities this call was made with.
  virtual const json &clientCapabilities() const = 0;
  /// The request's _meta (progress token, protocol fields), or an empty object.
  virtual const json &requestMeta() const = 0;
  /// The request's whole params (inputResponses and requestState of a
  /// multi-round request live there).
  virtual const json &requestParams() const = 0;
  /// True for a stateless (2026-07-28) request: the client cannot be asked
  /// anything mid-call, so a tool needing input answers input_required.
  virtual bool stateless() const = 0;
  /// Asks the client several things at once (key -> {method, params}) and
  /// returns key -> result. A task parks with all of them pending, so the
  /// client may answer them in any order; elsewhere they are asked one by one.
  virtual json requestClientAll(const json &requests) {
    json results = json::object();
    for (auto it = requests.begin(); it != requests.end(); ++it)
      results[it.key()] = requestClient(it->value("method", ""),
                                        it->value("params", json::object()));
    return results;
  }
};

/// The tasks extension (SEP-2663): its capability key.
constexpr const char *kTasksExtension = "io.modelcontextprotocol/tasks";

/// One tool: its schemas and the function that runs it. The handler returns
/// a CallToolResult object ({content, structuredContent?, isError?}); an
/// exception it throws (other than RpcError) becomes an isError result.
struct ToolDef {
  std::string name, title, description;
  json inputSchema = json{{"type", "object"}, {"properties", json::object()}};
  json outputSchema; ///< null when the tool has none
  /// Client capabilities the tool cannot run without ({"sampling": {}}); a
  /// stateless caller lacking one gets error -32021 (HTTP 400).
  json requiredCapabilities = json::object();
  std::function<json(const json &arguments, CallContext &context)> handler;
  /// Whether a call may run as a task (tasks extension): "forbidden" (always
  /// answered in the call), "optional" (a task when the client declared the
  /// extension, else in the call) or "required" (a client without the
  /// extension gets -32021).
  std::string taskSupport = "forbidden";
  /// Optional, for task tools: runs in the call before a task is created; a
  /// non-null result (an input_required round) is answered instead, so input
  /// can be gathered synchronously before the work goes asynchronous.
  std::function<json(const json &arguments, CallContext &context)> beforeTask;
};

/// A concrete resource (resources/list) or a template (resources/templates/list).
struct ResourceDef {
  std::string uri, name, title, description, mimeType;
  bool isTemplate = false; ///< uri is an RFC 6570 template like x://a/{id}
  /// Returns the `contents` array for a concrete URI matched by this entry.
  std::function<json(const std::string &uri,
                     const std::map<std::string, std::string> &variables)>
      read;
};

/// A prompt and the function that renders its messages.
struct PromptDef {
  std::string name, title, description;
  json arguments = json::array(); ///< [{name, description, required}]
  /// Returns a GetPromptResult (or an input_required result).
  std::function<json(const json &arguments, CallContext &context)> render;
};

/// Everything one server offers.
struct Registry {
  std::vector<ToolDef> tools;
  std::vector<ResourceDef> resources;
  std::vector<PromptDef> prompts;
  bool completions = false; ///< advertise completion/complete
  std::string instructions;
};

/// A CallToolResult with one text item and isError set.
json toolError(const std::string &message);
/// A CallToolResult whose text is STRUCTURED serialised, plus structuredContent.
json toolStructured(const json &structured, bool isError = false);

/// The adapt commands the tools call, in-process: each takes its tool's
/// arguments (checked against the tool's input schema and confined to the
/// workspace) and returns the command's exit code, printing what the command
/// line prints. tools/McpCommands.cpp binds them to the commands' functions,
/// so agent/ does not depend on tools/.
struct AdaptCommands {
  using Command = std::function<int(const json &arguments)>;
  Command inspect, gaps, build, validate, generate;
};

/// Adds the adapt tools (inspect, gaps, build, validate, generate, list and
/// show review candidates), each calling its command in COMMANDS in a forked
/// child (Isolated.h); every path argument is confined to WORKSPACE before a
/// command sees it.
void addAdaptTools(Registry &registry, const AdaptCommands &commands,
                   const Workspace &workspace);

/// Adds the tools, resources and prompts the MCP conformance suite expects
/// of a server under test (only with `adapt serve --test-mode`).
void addConformanceFixtures(Registry &registry);
/// The part of the fixtures for the tasks extension (greet, slow_compute,
/// failing_job, protocol_error_job, confirm_delete, multi_input,
/// test_tool_with_task) and for Mcp-Param headers (test_param_header).
void addTaskFixtures(Registry &registry);
/// The part of the fixtures for 2026-07-28's multi-round requests
/// (input_required results, requestState) and stateless diagnostics.
void addMultiRoundFixtures(Registry &registry);

/// The InputRequiredResult asking the client for INPUTREQUESTS (key ->
/// {method, params}), with STATE when not empty.
json inputRequired(const json &inputRequests, const std::string &state = "");
/// The client's answer to input request KEY when the retry carries a
/// well-formed one (an object), else null.
json inputResponse(const json &params, const std::string &key);

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPREGISTRY_H
