//===- McpFixturesTasks.cpp - tasks-extension conformance fixtures --------===//
//
// Test-mode fixtures the tasks scenarios (SEP-2663) call by name: a
// synchronous tool, task tools that sleep, fail, break, or park for client
// input, one that gathers input in the call and then goes asynchronous, and a
// tool whose argument is mirrored in an Mcp-Param header (SEP-2243).
// Registered only by --test-mode.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpFixtureSupport.h"
#include "agent/mcp/McpRegistry.h"

#include <chrono>
#include <thread>

namespace adapt::mcp {
namespace {


ToolDef taskTool(const std::string &name, const std::string &description,
                 const std::string &taskSupport,
                 std::function<json(const json &, CallContext &)> handler) {
  ToolDef tool = simpleTool(name, description, std::move(handler));
  tool.taskSupport = taskSupport;
  return tool;
}

/// Sleeps SECONDS in small steps; false when the caller cancelled meanwhile.
bool sleepUnlessCancelled(double seconds, CallContext &context) {
  auto end = std::chrono::steady_clock::now() +
             std::chrono::milliseconds(static_cast<long>(seconds * 1000));
  while (std::chrono::steady_clock::now() < end) {
    if (context.cancelled())
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !context.cancelled();
}

/// An elicitation/create request for a confirmation form.
json confirmRequest(const std::string &message) {
  json schema = json::parse(R"({"type": "object", "properties": {
      "confirm": {"type": "boolean"}, "name": {"type": "string"}}})");
  return json{{"method", "elicitation/create"},
              {"params", json{{"mode", "form"},
                              {"message", message},
                              {"requestedSchema", schema}}}};
}

} // namespace

void addTaskFixtures(Registry &registry) {
  auto &tools = registry.tools;
  ToolDef greet = taskTool("greet", "Says hello (never a task)", "forbidden",
                           [](const json &arguments, CallContext &) {
                             return textResult("Hello, " +
                                               arguments.value("name", "") + "!");
                           });
  greet.inputSchema = json::parse(R"({"type": "object",
      "properties": {"name": {"type": "string"}}, "required": ["name"]})");
  tools.push_back(greet);

  ToolDef slow = taskTool(
      "slow_compute", "Sleeps `seconds` then answers; a task when possible",
      "optional", [](const json &arguments, CallContext &context) {
        double seconds = arguments.value("seconds", 0.0);
        std::string label = arguments.value("label", "");
        if (!sleepUnlessCancelled(seconds, context))
          return textResult("slow_compute " + label + " cancelled");
        return textResult("slow_compute " + label + " done after " +
                          json(seconds).dump() + " s");
      });
  slow.inputSchema = json::parse(R"({"type": "object", "properties": {
      "seconds": {"type": "number", "minimum": 0},
      "label": {"type": "string"}}})");
  tools.push_back(slow);

  tools.push_back(taskTool(
      "failing_job", "Fails as a tool after about a second (task required)",
      "required", [](const json &, CallContext &context) -> json {
        sleepUnlessCancelled(1.0, context);
        throw std::runtime_error("failing_job failed on purpose");
      }));
  tools.push_back(taskTool(
      "protocol_error_job", "Breaks with a protocol-level error", "optional",
      [](const json &, CallContext &) -> json {
        throw RpcError(kInternalError,
                       "protocol_error_job: simulated internal failure");
      }));

  ToolDef confirm = taskTool(
      "confirm_delete", "Asks the client to confirm, then 'deletes' a file",
      "optional", [](const json &arguments, CallContext &context) {
        std::string file = arguments.value("filename", "");
        json answer = context.requestClient(
            "elicitation/create",
            confirmRequest("Delete " + file + "?")["params"]);
        bool yes = answer.value("action", "") == "accept";
        return textResult(yes ? "deleted " + file : "kept " + file);
      });
  confirm.inputSchema = json::parse(R"({"type": "object",
      "properties": {"filename": {"type": "string"}}})");
  tools.push_back(confirm);

  tools.push_back(taskTool(
      "multi_input", "Asks the client two things at once", "optional",
      [](const json &, CallContext &context) {
        json answers = context.requestClientAll(
            json{{"first", confirmRequest("First answer?")},
                 {"second", confirmRequest("Second answer?")}});
        return textResult("answers: " + answers.dump());
      }));

  ToolDef withTask = taskTool(
      "test_tool_with_task",
      "Asks for user_name in the call (input_required), then runs as a task",
      "required", [](const json &, CallContext &context) {
        json answer = inputResponse(context.requestParams(), "user_name");
        std::string name = answer.is_object()
                               ? answer.value("content", json::object())
                                     .value("name", std::string("?"))
                               : "?";
        return textResult("Hello, " + name + " (from a task)");
      });
  withTask.beforeTask = [](const json &, CallContext &context) -> json {
    if (inputResponse(context.requestParams(), "user_name").is_object())
      return nullptr;
    return inputRequired(json{
        {"user_name",
         {{"method", "elicitation/create"},
          {"params",
           {{"mode", "form"},
            {"message", "What is your name?"},
            {"requestedSchema",
             {{"type", "object"},
              {"properties", {{"name", {{"type", "string"}}}}},
              {"required", json::array({"name"})}}}}}}}});
  };
  tools.push_back(withTask);

  ToolDef header = taskTool(
      "test_param_header",
      "Echoes `region`, which clients mirror in the Mcp-Param-Region header",
      "forbidden", [](const json &arguments, CallContext &) {
        return textResult("region: " + arguments.value("region", ""));
      });
  header.inputSchema = json::parse(R"({"type": "object", "properties": {
      "region": {"type": "string", "x-mcp-header": "Region"}},
      "required": ["region"]})");
  tools.push_back(header);
}

} // namespace adapt::mcp
