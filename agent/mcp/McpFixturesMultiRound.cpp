//===- McpFixturesMultiRound.cpp - 2026-07-28 conformance fixtures -------===//
//
// Test-mode fixtures for the stateless revision: tools and a prompt that ask
// the client for input through input_required results (requestState carried
// by the client between rounds), plus the diagnostic tools the
// server-stateless scenario probes. Registered only by --test-mode.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpFixtureSupport.h"
#include "agent/mcp/McpRegistry.h"

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

namespace adapt::mcp {
namespace {


/// A string value as is, anything else as JSON text.
std::string asText(const json &value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}


/// Per-process secret that keys the requestState checksum.
uint64_t stateSecret() {
  static const uint64_t secret = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  return secret;
}

/// A keyed FNV-1a checksum of PAYLOAD. Enough for a test fixture to notice
/// a modified requestState; not a cryptographic MAC.
std::string checksum(const std::string &payload) {
  uint64_t hash = 1469598103934665603ull ^ stateSecret();
  for (unsigned char c : payload) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  static const char *digits = "0123456789abcdef";
  std::string out;
  for (int shift = 60; shift >= 0; shift -= 4)
    out += digits[(hash >> shift) & 15];
  return out;
}

/// PAYLOAD with its checksum appended, as handed to the client.
std::string signState(const std::string &payload) {
  return payload + "." + checksum(payload);
}

/// The payload of the requestState in PARAMS when its checksum holds;
/// throws -32602 when a state is present but was modified; "" when absent.
std::string verifiedState(const json &params) {
  if (!params.contains("requestState"))
    return "";
  if (!params["requestState"].is_string())
    throw RpcError(kInvalidParams, "requestState must be a string");
  std::string state = params["requestState"];
  size_t dot = state.rfind('.');
  if (dot == std::string::npos ||
      checksum(state.substr(0, dot)) != state.substr(dot + 1))
    throw RpcError(kInvalidParams, "requestState failed its integrity check");
  return state.substr(0, dot);
}

json elicitation(const std::string &message, const std::string &property,
                 const std::string &type = "string") {
  json schema = {{"type", "object"},
                 {"properties", {{property, {{"type", type}}}}},
                 {"required", json::array({property})}};
  return json{{"method", "elicitation/create"},
              {"params", {{"message", message}, {"requestedSchema", schema}}}};
}

/// The input_required result asking the client to confirm (a boolean form),
/// with \p state as the signed requestState of the next round.
json askConfirmation(const std::string &state) {
  return inputRequired({{"confirm", elicitation("Please confirm", "ok", "boolean")}},
                       signState(state));
}

json sampling(const std::string &prompt, int maxTokens) {
  return json{{"method", "sampling/createMessage"},
              {"params", {{"messages", json::array({{{"role", "user"},
                                                     {"content", text(prompt)}}})},
                          {"maxTokens", maxTokens}}}};
}

json listRoots() {
  return json{{"method", "roots/list"}, {"params", json::object()}};
}

/// The accepted form content of an elicitation answer, or null.
json acceptedContent(const json &answer) {
  if (answer.is_object() && answer.value("action", "") == "accept" &&
      answer.contains("content") && answer["content"].is_object())
    return answer["content"];
  return nullptr;
}

std::string samplingText(const json &answer) {
  if (answer.contains("content") && answer["content"].is_object())
    return answer["content"].value("text", "");
  return "";
}


void addInputTools(Registry &registry) {
  auto &tools = registry.tools;
  tools.push_back(simpleTool(
      "test_input_required_result_elicitation", "Asks the user's name through input_required",
      [](const json &, CallContext &context) {
        json answer = acceptedContent(inputResponse(context.requestParams(), "user_name"));
        if (answer.is_object() && answer.contains("name"))
          return textResult("Hello, " + asText(answer["name"]) + "!");
        return inputRequired({{"user_name", elicitation("What is your name?", "name")}});
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_sampling", "Asks the client's model through input_required",
      [](const json &, CallContext &context) {
        json answer = inputResponse(context.requestParams(), "capital_question");
        if (answer.is_object())
          return textResult("Sampling response: " + samplingText(answer));
        return inputRequired(
            {{"capital_question", sampling("What is the capital of France?", 100)}});
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_list_roots", "Asks the client's roots through input_required",
      [](const json &, CallContext &context) {
        json answer = inputResponse(context.requestParams(), "client_roots");
        if (answer.is_object() && answer.contains("roots") && answer["roots"].is_array()) {
          std::string list;
          for (const json &root : answer["roots"])
            if (root.is_object())
              list += (list.empty() ? "" : ", ") + root.value("uri", "");
          return textResult("Client roots: " + list);
        }
        return inputRequired({{"client_roots", listRoots()}});
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_request_state", "Round-trips a requestState",
      [](const json &, CallContext &context) {
        const json &params = context.requestParams();
        std::string state = verifiedState(params);
        json answer = inputResponse(params, "confirm");
        if (answer.is_object() && state == "confirm-round-1")
          return textResult("state-ok: confirmation received");
        return askConfirmation("confirm-round-1");
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_multiple_inputs", "Asks three inputs at once",
      [](const json &, CallContext &context) {
        const json &params = context.requestParams();
        std::string state = verifiedState(params);
        json name = inputResponse(params, "user_name");
        json greeting = inputResponse(params, "greeting");
        json roots = inputResponse(params, "client_roots");
        if (state == "multiple-round-1" && name.is_object() && greeting.is_object() &&
            roots.is_object())
          return textResult("All inputs received: name, greeting and roots");
        return inputRequired({{"user_name", elicitation("What is your name?", "name")},
                              {"greeting", sampling("Generate a greeting", 50)},
                              {"client_roots", listRoots()}},
                             signState("multiple-round-1"));
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_multi_round", "Asks two questions in two rounds",
      [](const json &, CallContext &context) {
        const json &params = context.requestParams();
        std::string state = verifiedState(params);
        json step2 = acceptedContent(inputResponse(params, "step2"));
        if (state == "multi-round-2" && step2.is_object())
          return textResult("Multi-round complete: color " + asText(step2.value("color", json(""))));
        json step1 = acceptedContent(inputResponse(params, "step1"));
        if (state == "multi-round-1" && step1.is_object())
          return inputRequired(
              {{"step2", elicitation("Step 2: What is your favorite color?", "color")}},
              signState("multi-round-2"));
        return inputRequired({{"step1", elicitation("Step 1: What is your name?", "name")}},
                             signState("multi-round-1"));
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_tampered_state", "Rejects a modified requestState",
      [](const json &, CallContext &context) {
        const json &params = context.requestParams();
        std::string state = verifiedState(params); // throws when tampered
        if (state == "tamper-round-1" &&
            inputResponse(params, "confirm").is_object())
          return textResult("state verified");
        return askConfirmation("tamper-round-1");
      }));
  tools.push_back(simpleTool(
      "test_input_required_result_capabilities", "Asks only what the client can answer",
      [](const json &, CallContext &context) {
        const json &params = context.requestParams();
        const json &caps = context.clientCapabilities();
        json requests = json::object();
        auto has = [&](const char *name) { return caps.is_object() && caps.contains(name); };
        if (has("sampling") && !inputResponse(params, "question").is_object())
          requests["question"] = sampling("Say hello", 20);
        if (has("elicitation") && !inputResponse(params, "user_name").is_object())
          requests["user_name"] = elicitation("What is your name?", "name");
        if (has("roots") && !inputResponse(params, "client_roots").is_object())
          requests["client_roots"] = listRoots();
        if (requests.empty())
          return textResult("capabilities respected");
        return inputRequired(requests);
      }));
}

void addDiagnosticTools(Registry &registry) {
  auto &tools = registry.tools;
  ToolDef missing = simpleTool("test_missing_capability",
                         "Needs the sampling capability (rejected with -32021 without it)",
                         [](const json &, CallContext &) {
                           return textResult("sampling capability declared");
                         });
  missing.requiredCapabilities = {{"sampling", json::object()}};
  tools.push_back(missing);
  tools.push_back(simpleTool(
      "test_streaming_elicitation", "Asks for input: input_required when stateless",
      [](const json &, CallContext &context) {
        json question = elicitation("Please confirm", "confirmed", "boolean");
        if (context.stateless()) {
          json answer = inputResponse(context.requestParams(), "confirm");
          if (answer.is_object())
            return textResult("confirmation received");
          return inputRequired({{"confirm", question}});
        }
        json answer = context.requestClient("elicitation/create", question["params"]);
        return textResult("action=" + answer.value("action", ""));
      }));
  tools.push_back(simpleTool(
      "adapt_test_wait_for_cancel", "Reports progress every 50 ms for up to 20 s, "
      "or until the client cancels: the cancellation test's long tool",
      [](const json &, CallContext &context) {
        for (int step = 0; step < 400 && !context.cancelled(); ++step) {
          context.progress(step, 400.0, "");
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return textResult(context.cancelled() ? "cancelled" : "finished");
      }));
  tools.push_back(simpleTool("test_logging_tool", "Logs three messages at info",
                       [](const json &, CallContext &context) {
                         context.log("info", "logging tool started");
                         context.log("info", "logging tool working");
                         context.log("info", "logging tool finished");
                         return textResult("logging tool done");
                       }));
  ToolDef schema2020 = simpleTool(
      "json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features",
      [](const json &arguments, CallContext &) {
        return textResult("JSON Schema 2020-12 tool called with: " + arguments.dump());
      });
  // $schema, $defs with an $anchor, composition and conditional keywords:
  // the vocabulary a listing must pass through untouched (SEP-1613/2106).
  schema2020.inputSchema = json::parse(R"({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"$anchor": "addressDef", "type": "object",
              "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                   "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                   "phone": {"type": "string"}, "email": {"type": "string"}},
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": false
  })");
  tools.push_back(schema2020);
}

void addInputPrompt(Registry &registry) {
  PromptDef prompt;
  prompt.name = "test_input_required_result_prompt";
  prompt.description = "A prompt that asks the user for context first";
  prompt.render = [](const json &, CallContext &context) {
    json answer = acceptedContent(inputResponse(context.requestParams(), "user_context"));
    if (answer.is_object())
      return json{{"messages",
                   json::array({{{"role", "user"},
                                 {"content", text("Context: " +
                                                  asText(answer.value("context", json(""))))}}})}};
    return inputRequired(
        {{"user_context", elicitation("What context should the prompt use?", "context")}});
  };
  registry.prompts.push_back(prompt);
}

} // namespace

void addMultiRoundFixtures(Registry &registry) {
  addInputTools(registry);
  addDiagnosticTools(registry);
  addInputPrompt(registry);
}

} // namespace adapt::mcp
