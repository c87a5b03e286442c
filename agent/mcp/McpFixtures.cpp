//===- McpFixtures.cpp - what the MCP conformance suite expects ----------===//
//
// The tools, resources and prompts that @modelcontextprotocol/conformance's
// server scenarios call by name. Registered only by `adapt serve
// --test-mode`; they exist to prove the protocol layer, not to do work.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpFixtureSupport.h"
#include "agent/mcp/McpRegistry.h"

#include <chrono>
#include <thread>

namespace adapt::mcp {
namespace {

/// A 1x1 PNG and a minimal WAV, base64: the payloads the suite checks for.
constexpr const char *kPng =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
constexpr const char *kWav =
    "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";


json content(json items) { return json{{"content", std::move(items)}}; }


/// An object schema whose one, required property \p name is a string.
json oneStringSchema(const char *name, const char *description) {
  return {{"type", "object"},
          {"properties", {{name, {{"type", "string"}, {"description", description}}}}},
          {"required", {name}}};
}

void sleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

/// Asks the client to fill in a form and describes its answer.
json elicit(CallContext &context, const std::string &message,
            const json &schema, const std::string &prefix) {
  try {
    json result = context.requestClient(
        "elicitation/create",
        json{{"mode", "form"}, {"message", message}, {"requestedSchema", schema}});
    return content(json::array({text(
        prefix + "action=" + result.value("action", "") +
        ", content=" + result.value("content", json::object()).dump())}));
  } catch (const std::exception &error) {
    return content(json::array(
        {text(std::string("Elicitation not supported or error: ") + error.what())}));
  }
}

void addTools(Registry &registry) {
  auto &tools = registry.tools;
  tools.push_back(simpleTool("test_simple_text", "Tests simple text content response",
                             [](const json &, CallContext &) {
                               return content(json::array({text(
                                   "This is a simple text response for testing.")}));
                             }));
  tools.push_back(simpleTool("test_image_content", "Tests image content response",
                             [](const json &, CallContext &) {
                               return content(json::array({{{"type", "image"},
                                                            {"data", kPng},
                                                            {"mimeType", "image/png"}}}));
                             }));
  tools.push_back(simpleTool("test_audio_content", "Tests audio content response",
                             [](const json &, CallContext &) {
                               return content(json::array({{{"type", "audio"},
                                                            {"data", kWav},
                                                            {"mimeType", "audio/wav"}}}));
                             }));
  tools.push_back(simpleTool(
      "test_embedded_resource", "Tests embedded resource content response",
      [](const json &, CallContext &) {
        return content(json::array(
            {{{"type", "resource"},
              {"resource", {{"uri", "test://embedded-resource"},
                            {"mimeType", "text/plain"},
                            {"text", "This is an embedded resource content."}}}}}));
      }));
  tools.push_back(simpleTool(
      "test_multiple_content_types",
      "Tests response with multiple content types (text, image, resource)",
      [](const json &, CallContext &) {
        return content(json::array(
            {text("Multiple content types test:"),
             {{"type", "image"}, {"data", kPng}, {"mimeType", "image/png"}},
             {{"type", "resource"},
              {"resource", {{"uri", "test://mixed-content-resource"},
                            {"mimeType", "application/json"},
                            {"text", json{{"test", "data"}, {"value", 123}}.dump()}}}}}));
      }));
  tools.push_back(simpleTool(
      "test_tool_with_logging", "Tests tool that emits log messages during execution",
      [](const json &, CallContext &context) {
        context.log("info", "Tool execution started");
        sleepMs(50);
        context.log("info", "Tool processing data");
        sleepMs(50);
        context.log("info", "Tool execution completed");
        return content(json::array({text("Tool with logging executed successfully")}));
      }));
  tools.push_back(simpleTool(
      "test_tool_with_progress", "Tests tool that reports progress notifications",
      [](const json &, CallContext &context) {
        for (int step : {0, 50, 100}) {
          context.progress(step, 100.0,
                           "Completed step " + std::to_string(step) + " of 100");
          if (step != 100)
            sleepMs(50);
        }
        json token = context.requestMeta().value("progressToken", json(0));
        return content(json::array(
            {text(token.is_string() ? token.get<std::string>() : token.dump())}));
      }));
  tools.push_back(simpleTool("test_error_handling", "Tests error response handling",
                             [](const json &, CallContext &) -> json {
                               return toolError("This tool intentionally returns "
                                                "an error for testing");
                             }));
  ToolDef sampling = simpleTool(
      "test_sampling", "Tests server-initiated sampling (LLM completion request)",
      [](const json &arguments, CallContext &context) {
        try {
          json result = context.requestClient(
              "sampling/createMessage",
              json{{"messages",
                    json::array({{{"role", "user"},
                                  {"content", text(arguments.value("prompt", ""))}}})},
                   {"maxTokens", 100}});
          std::string reply = "No response";
          if (result.contains("content") && result["content"].is_object())
            reply = result["content"].value("text", reply);
          return content(json::array({text("LLM response: " + reply)}));
        } catch (const std::exception &error) {
          return content(json::array(
              {text(std::string("Sampling not supported or error: ") + error.what())}));
        }
      });
  sampling.inputSchema = oneStringSchema("prompt", "The prompt to send to the LLM");
  tools.push_back(sampling);
  ToolDef elicitation = simpleTool(
      "test_elicitation", "Tests server-initiated elicitation (user input request)",
      [](const json &arguments, CallContext &context) {
        return elicit(context, arguments.value("message", ""),
                      oneStringSchema("response", "User's response"), "User response: ");
      });
  elicitation.inputSchema = oneStringSchema("message", "The message to show the user");
  tools.push_back(elicitation);
  tools.push_back(simpleTool(
      "test_elicitation_sep1034_defaults", "Tests elicitation with default values per SEP-1034",
      [](const json &, CallContext &context) {
        json schema = {
            {"type", "object"},
            {"properties",
             {{"name", {{"type", "string"}, {"description", "User name"}, {"default", "John Doe"}}},
              {"age", {{"type", "integer"}, {"description", "User age"}, {"default", 30}}},
              {"score", {{"type", "number"}, {"description", "User score"}, {"default", 95.5}}},
              {"status", {{"type", "string"},
                          {"description", "User status"},
                          {"enum", {"active", "inactive", "pending"}},
                          {"default", "active"}}},
              {"verified", {{"type", "boolean"},
                            {"description", "Verification status"},
                            {"default", true}}}}},
            {"required", json::array()}};
        return elicit(context, "Please review and update the form fields with defaults",
                      schema, "Elicitation completed: ");
      }));
  tools.push_back(simpleTool(
      "test_elicitation_sep1330_enums", "Tests elicitation with enum schema improvements per SEP-1330",
      [](const json &, CallContext &context) {
        auto titled = [](const std::string &prefix, const char *a, const char *b,
                         const char *c) {
          return json::array({{{"const", prefix + "1"}, {"title", a}},
                              {{"const", prefix + "2"}, {"title", b}},
                              {{"const", prefix + "3"}, {"title", c}}});
        };
        json schema = {
            {"type", "object"},
            {"properties",
             {{"untitledSingle", {{"type", "string"},
                                  {"description", "Select one option"},
                                  {"enum", {"option1", "option2", "option3"}}}},
              {"titledSingle", {{"type", "string"},
                                {"description", "Select one option with titles"},
                                {"oneOf", titled("value", "First Option", "Second Option",
                                                 "Third Option")}}},
              {"legacyEnum", {{"type", "string"},
                              {"description", "Select one option (legacy)"},
                              {"enum", {"opt1", "opt2", "opt3"}},
                              {"enumNames", {"Option One", "Option Two", "Option Three"}}}},
              {"untitledMulti", {{"type", "array"},
                                 {"description", "Select multiple options"},
                                 {"minItems", 1},
                                 {"maxItems", 3},
                                 {"items", {{"type", "string"},
                                            {"enum", {"option1", "option2", "option3"}}}}}},
              {"titledMulti", {{"type", "array"},
                               {"description", "Select multiple options with titles"},
                               {"minItems", 1},
                               {"maxItems", 3},
                               {"items", {{"anyOf", titled("value", "First Choice",
                                                           "Second Choice",
                                                           "Third Choice")}}}}}}},
            {"required", json::array()}};
        return elicit(context, "Please select options from the enum fields", schema,
                      "Elicitation completed: ");
      }));
}

void addResources(Registry &registry) {
  // A resource whose one content item has FIELD ("text" or "blob") = VALUE.
  auto fixed = [](const char *uri, const char *name, const char *title,
                  const char *description, const char *mime, const char *field,
                  const std::string &value) {
    ResourceDef resource;
    resource.uri = uri;
    resource.name = name;
    resource.title = title;
    resource.description = description;
    resource.mimeType = mime;
    json contents = json::array({{{"uri", uri}, {"mimeType", mime}, {field, value}}});
    resource.read = [contents](const std::string &,
                               const std::map<std::string, std::string> &) {
      return contents;
    };
    return resource;
  };
  registry.resources.push_back(fixed("test://static-text", "static-text", "Static Text Resource",
                                     "A static text resource for testing", "text/plain", "text",
                                     "This is the content of the static text resource."));
  registry.resources.push_back(fixed("test://static-binary", "static-binary",
                                     "Static Binary Resource",
                                     "A static binary resource (image) for testing", "image/png",
                                     "blob", kPng));
  registry.resources.push_back(fixed("test://watched-resource", "watched-resource",
                                     "Watched Resource", "A resource that can be subscribed to",
                                     "text/plain", "text", "Watched resource content"));
  ResourceDef templated =
      fixed("test://template/{id}/data", "template", "Resource Template",
            "A resource template with parameter substitution", "application/json", "text", "");
  templated.isTemplate = true;
  templated.read = [](const std::string &uri,
                      const std::map<std::string, std::string> &variables) {
    std::string id = variables.count("id") ? variables.at("id") : "";
    return json::array(
        {{{"uri", uri},
          {"mimeType", "application/json"},
          {"text", json{{"id", id}, {"templateTest", true}, {"data", "Data for ID: " + id}}
                       .dump()}}});
  };
  registry.resources.push_back(templated);
}

json userMessage(json item) {
  return json{{"role", "user"}, {"content", std::move(item)}};
}

/// A prompt's identity; its arguments and render are the caller's to fill in.
PromptDef describedPrompt(const char *name, const char *title, const char *description) {
  PromptDef prompt;
  prompt.name = name;
  prompt.title = title;
  prompt.description = description;
  return prompt;
}

void addPrompts(Registry &registry) {
  PromptDef simple = describedPrompt("test_simple_prompt",
                                     "Simple Test Prompt",
                                     "A simple prompt without arguments");
  simple.render = [](const json &, CallContext &) {
    return json{{"messages",
                 json::array({userMessage(text("This is a simple prompt for testing."))})}};
  };
  registry.prompts.push_back(simple);

  PromptDef withArguments = describedPrompt("test_prompt_with_arguments",
                                            "Prompt With Arguments",
                                            "A prompt with required arguments");
  withArguments.arguments = json::array(
      {{{"name", "arg1"}, {"description", "First test argument"}, {"required", true}},
       {{"name", "arg2"}, {"description", "Second test argument"}, {"required", true}}});
  withArguments.render = [](const json &arguments, CallContext &) {
    return json{{"messages", json::array({userMessage(text(
                                 "Prompt with arguments: arg1='" +
                                 arguments.value("arg1", "") + "', arg2='" +
                                 arguments.value("arg2", "") + "'"))})}};
  };
  registry.prompts.push_back(withArguments);

  PromptDef embedded = describedPrompt("test_prompt_with_embedded_resource",
                                       "Prompt With Embedded Resource",
                                       "A prompt that includes an embedded resource");
  embedded.arguments = json::array({{{"name", "resourceUri"},
                                     {"description", "URI of the resource to embed"},
                                     {"required", true}}});
  embedded.render = [](const json &arguments, CallContext &) {
    return json{
        {"messages",
         json::array({userMessage({{"type", "resource"},
                                   {"resource", {{"uri", arguments.value("resourceUri", "")},
                                                 {"mimeType", "text/plain"},
                                                 {"text", "Embedded resource content for testing."}}}}),
                      userMessage(text("Please process the embedded resource above."))})}};
  };
  registry.prompts.push_back(embedded);

  PromptDef image = describedPrompt("test_prompt_with_image",
                                    "Prompt With Image",
                                    "A prompt that includes image content");
  image.render = [](const json &, CallContext &) {
    return json{{"messages",
                 json::array({userMessage({{"type", "image"},
                                           {"data", kPng},
                                           {"mimeType", "image/png"}}),
                              userMessage(text("Please analyze the image above."))})}};
  };
  registry.prompts.push_back(image);
}

} // namespace

void addConformanceFixtures(Registry &registry) {
  for (void (*add)(Registry &) : {addTools, addResources, addPrompts, addMultiRoundFixtures,
                                  addTaskFixtures})
    add(registry);
  registry.completions = true;
}

} // namespace adapt::mcp
