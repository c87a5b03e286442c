//===- AdaptTools.cpp - the adapt commands as MCP tools ------------------===//
//
// Each tool calls its adapt command in-process (AdaptCommands: the same
// functions the command line calls, with the same checks and messages), in a
// child forked for the call (Isolated.h: a crash cannot take the server down,
// and a cancel stops it), streams a progress heartbeat while it runs, and
// returns the exit code and output as structured content.
// Exit codes follow README.md: 0 ok, 2 bad input, 3 gaps, 4 check failed.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/Isolated.h"
#include "agent/mcp/McpRegistry.h"

#include <dirent.h>
#include <fstream>
#include <functional>
#include <sstream>
#include <sys/stat.h>

namespace adapt::mcp {
namespace {

json stringProperty(const std::string &description) {
  return json{{"type", "string"}, {"description", description}};
}

json objectSchema(json properties, json required) {
  return json{{"type", "object"},
              {"properties", std::move(properties)},
              {"required", std::move(required)},
              {"additionalProperties", false}};
}

/// How long a tool may run: a long one is run as a task when the client can.
enum class Duration { Short, Long };

/// A tool's identity: its NAME, TITLE and DESCRIPTION, and whether it may run
/// long; the schemas and handler are the caller's to fill in.
ToolDef describedTool(const char *name, const char *title, const char *description,
                      Duration duration = Duration::Short) {
  ToolDef tool;
  tool.name = name;
  tool.title = title;
  tool.description = description;
  if (duration == Duration::Long)
    tool.taskSupport = "optional";
  return tool;
}

/// The `path` property of the tools that read a model.
json modelPathProperty() {
  return stringProperty("model folder, config.json or .onnx file");
}

/// The `registry` property of the tools that match against the registry.
json registryProperty() { return stringProperty("operator registry (ops.json)"); }

/// The input schema of a tool that reads the model at `path` and writes into
/// the folder `out` (\p outDescription): those two, required, and \p more.
json modelToFolderSchema(const char *outDescription, json more) {
  more["path"] = modelPathProperty();
  more["out"] = stringProperty(outDescription);
  return objectSchema(std::move(more), {"path", "out"});
}

/// The output schema shared by the command-running tools.
json commandOutputSchema(json extra = json::object()) {
  json properties = {{"exitCode", {{"type", "integer"}}},
                     {"stdout", {{"type", "string"}}},
                     {"stderr", {{"type", "string"}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it)
    properties[it.key()] = it.value();
  return json{{"type", "object"},
              {"properties", properties},
              {"required", {"exitCode", "stdout", "stderr"}}};
}

std::string readFile(const std::string &path, bool &ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool isDirectory(const std::string &path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

/// A candidate id is one path component: no separators, no "..".
bool safeId(const std::string &id) {
  return !id.empty() && id != "." && id != ".." &&
         id.find('/') == std::string::npos && id.find('\0') == std::string::npos;
}

/// Calls COMMAND on the tool's ARGUMENTS (runIsolated) and shapes the
/// result: exit codes in OK_CODES are successes; any other is an isError
/// result carrying the same structure.
json runCommand(const AdaptCommands::Command &command, const json &arguments,
                CallContext &context, const std::string &label,
                std::initializer_list<int> okCodes, json extra = json::object()) {
  IsolatedResult child = runIsolated([&] { return command(arguments); }, context, label);
  if (child.cancelled)
    return toolError(label + " was cancelled");
  json structured = {{"exitCode", child.exitCode},
                     {"stdout", child.stdoutText},
                     {"stderr", child.stderrText}};
  for (auto it = extra.begin(); it != extra.end(); ++it)
    structured[it.key()] = it.value();
  bool ok = false;
  for (int code : okCodes)
    ok = ok || code == child.exitCode;
  json result = toolStructured(structured, !ok);
  if (!ok)
    result["content"] = json::array(
        {{{"type", "text"},
          {"text", "adapt " + label + " failed (exit " + std::to_string(child.exitCode) +
                       "): " + (child.stderrText.empty() ? child.stdoutText : child.stderrText)}}});
  return result;
}

/// For commands whose "check failed" exit code is a result, not a tool
/// failure: sets FIELD of RESULT's structured content to whether the command
/// exited 0, lets ADD_MORE put more into it, and (on success) shows the whole
/// structure as the text content, so clients without structured content see
/// it too.
json withOutcome(json result, const char *field,
                 const std::function<void(json &structured)> &addMore = nullptr) {
  if (!result.contains("structuredContent"))
    return result;
  json &structured = result["structuredContent"];
  structured[field] = structured["exitCode"] == 0;
  if (addMore)
    addMore(structured);
  if (!result.value("isError", false))
    result["content"][0]["text"] =
        structured.dump(2, ' ', false, json::error_handler_t::replace);
  return result;
}

ToolDef inspectTool(const AdaptCommands &commands) {
  ToolDef tool = describedTool(
      "inspect", "Inspect a model",
      "Reads a model folder (config.json + weight manifest) or an .onnx "
      "file and prints its summary, its adapt-dialect MLIR, or the MLIR "
      "after analysis (`adapt inspect`).");
  tool.inputSchema = objectSchema(
      {{"path", modelPathProperty()},
       {"emit", {{"type", "string"}, {"enum", {"summary", "mlir", "analysed"}}}},
       {"registry", stringProperty("operator registry (ops.json) to match against")}},
      {"path"});
  tool.outputSchema = commandOutputSchema();
  tool.handler = [run = commands.inspect](const json &arguments, CallContext &context) {
    return runCommand(run, arguments, context, "inspect", {0});
  };
  return tool;
}

ToolDef gapsTool(const AdaptCommands &commands) {
  ToolDef tool = describedTool("gaps", "Gap report",
                               "Lists the model's components the operator library lacks "
                               "(`adapt gaps`); writes gaps.json and gaps.md to `out`. "
                               "`complete` is true when nothing is missing.",
                               Duration::Long);
  tool.inputSchema =
      modelToFolderSchema("folder for gaps.json and gaps.md", {{"registry", registryProperty()}});
  tool.outputSchema = commandOutputSchema(
      {{"complete", {{"type", "boolean"}}}, {"report", {{"type", "object"}}}});
  tool.handler = [run = commands.gaps](const json &arguments, CallContext &context) {
    std::string out = arguments["out"];
    return withOutcome(runCommand(run, arguments, context, "gaps", {0, 3}), "complete",
                       [&](json &structured) {
                         bool ok = false;
                         std::string report = readFile(out + "/gaps.json", ok);
                         if (ok)
                           structured["report"] = json::parse(report, nullptr, false);
                         if (structured["report"].is_discarded())
                           structured.erase("report");
                       });
  };
  return tool;
}

ToolDef buildTool(const AdaptCommands &commands) {
  ToolDef tool = describedTool("build", "Build a LoRA trainer",
                               "Generates (and unless noCompile, compiles) the C++ LoRA "
                               "training program for a model into `out` (`adapt build`). "
                               "Long: reports progress while the compiler runs.",
                               Duration::Long);
  tool.inputSchema = modelToFolderSchema(
      "output folder of the trainer project",
      {{"loraTargets", {{"type", "array"}, {"items", {{"type", "string"}}}, {"minItems", 1}}},
       {"loraRank", {{"type", "integer"}, {"minimum", 1}, {"maximum", 65536}}},
       {"loraAlpha", {{"type", "number"}, {"exclusiveMinimum", 0}, {"maximum", 1e9}}},
       {"loraDropout", {{"type", "number"}, {"minimum", 0}, {"maximum", 1}}},
       {"rslora", {{"type", "boolean"}}},
       {"loraRouter", {{"type", "boolean"}}},
       {"noCompile", {{"type", "boolean"}}},
       {"allowGaps", {{"type", "boolean"}}},
       {"runtimeDir", stringProperty("runtime source folder")},
       {"registry", registryProperty()}});
  tool.outputSchema = commandOutputSchema({{"out", {{"type", "string"}}}});
  tool.handler = [run = commands.build](const json &arguments, CallContext &context) {
    return runCommand(run, arguments, context, "build", {0}, json{{"out", arguments["out"]}});
  };
  return tool;
}

ToolDef validateTool(const AdaptCommands &commands) {
  ToolDef tool = describedTool("validate", "Validate against the reference",
                               "Runs a stage of the validation ladder (`adapt validate`). "
                               "`passed` is false when a check failed (exit 4): a result, "
                               "not a tool failure; the record in `out` names the divergence.",
                               Duration::Long);
  tool.inputSchema = objectSchema(
      {{"path", stringProperty("model folder")},
       {"stage", {{"type", "string"}, {"enum", {"op", "model", "parallel", "full"}}}},
       {"out", stringProperty("folder for the validation record")},
       {"fixture", stringProperty("reference fixture folder (model stage)")},
       {"runtimeDir", stringProperty("runtime source folder")},
       {"layouts",
        {{"type", "array"},
         {"items", {{"type", "string"}}},
         {"minItems", 1},
         {"description", "parallel stage: the layouts to run, e.g. EP2, DP2xEP2 (default: every one)"}}},
       {"steps", {{"type", "integer"}, {"minimum", 1}, {"maximum", 1000},
                  {"description", "parallel stage: training steps (6)"}}}},
      {"path", "stage", "out"});
  tool.outputSchema = commandOutputSchema({{"passed", {{"type", "boolean"}}}});
  tool.handler = [run = commands.validate](const json &arguments, CallContext &context) {
    return withOutcome(runCommand(run, arguments, context, "validate", {0, 4}), "passed");
  };
  return tool;
}

/// The folder of review candidates under DIR (DIR/candidates/<id>/candidate.json).
std::string candidatesDir(const json &arguments) {
  return arguments["dir"].get<std::string>() + "/candidates";
}

ToolDef listCandidatesTool() {
  ToolDef tool = describedTool("list_candidates", "List review candidates",
                               "Lists the generated operator candidates awaiting review under "
                               "DIR/candidates/<id>/candidate.json. Approving one stays with a "
                               "human on the command line (`adapt review`).");
  tool.inputSchema = objectSchema({{"dir", stringProperty("output folder of adapt generate")}},
                                  {"dir"});
  tool.outputSchema = {
      {"type", "object"},
      {"properties", {{"candidates", {{"type", "array"},
                                      {"items", {{"type", "object"},
                                                 {"properties", {{"id", {{"type", "string"}}},
                                                                 {"record", {{"type", "object"}}}}},
                                                 {"required", {"id"}}}}}}}},
      {"required", {"candidates"}}};
  tool.handler = [](const json &arguments, CallContext &) {
    std::string dir = candidatesDir(arguments);
    json candidates = json::array();
    if (DIR *folder = opendir(dir.c_str())) {
      std::vector<std::string> ids;
      while (dirent *entry = readdir(folder))
        if (safeId(entry->d_name) && isDirectory(dir + "/" + entry->d_name))
          ids.push_back(entry->d_name);
      closedir(folder);
      std::sort(ids.begin(), ids.end());
      for (const std::string &id : ids) {
        bool ok = false;
        std::string text = readFile(dir + "/" + id + "/candidate.json", ok);
        json record = ok ? json::parse(text, nullptr, false) : json(nullptr);
        json entry = {{"id", id}};
        if (record.is_object())
          entry["record"] = record;
        candidates.push_back(entry);
      }
    } else if (!isDirectory(arguments["dir"])) {
      return toolError("no such folder: " + arguments["dir"].get<std::string>());
    }
    return toolStructured(json{{"candidates", candidates}});
  };
  return tool;
}

ToolDef showCandidateTool() {
  ToolDef tool = describedTool("show_candidate", "Show a review candidate",
                               "Returns one candidate's record "
                               "(DIR/candidates/<id>/candidate.json) and the names of its files.");
  tool.inputSchema = objectSchema({{"dir", stringProperty("output folder of adapt generate")},
                                   {"id", stringProperty("candidate id")}},
                                  {"dir", "id"});
  tool.outputSchema = {{"type", "object"},
                       {"properties", {{"id", {{"type", "string"}}},
                                       {"record", {{"type", "object"}}},
                                       {"files", {{"type", "array"},
                                                  {"items", {{"type", "string"}}}}}}},
                       {"required", {"id", "record", "files"}}};
  tool.handler = [](const json &arguments, CallContext &) {
    std::string id = arguments["id"];
    if (!safeId(id))
      return toolError("invalid candidate id \"" + id + "\"");
    std::string folder = candidatesDir(arguments) + "/" + id;
    bool ok = false;
    std::string text = readFile(folder + "/candidate.json", ok);
    if (!ok)
      return toolError("no candidate \"" + id + "\" (" + folder + "/candidate.json)");
    json record = json::parse(text, nullptr, false);
    if (!record.is_object())
      return toolError(folder + "/candidate.json is not a JSON object");
    json files = json::array();
    if (DIR *dir = opendir(folder.c_str())) {
      std::vector<std::string> names;
      while (dirent *entry = readdir(dir))
        if (safeId(entry->d_name))
          names.push_back(entry->d_name);
      closedir(dir);
      std::sort(names.begin(), names.end());
      for (const std::string &name : names)
        files.push_back(name);
    }
    return toolStructured(json{{"id", id}, {"record", record}, {"files", files}});
  };
  return tool;
}

/// `adapt generate`: candidates for the model's gaps under OUT/candidates.
/// The LLM's endpoint, model and key are the server's configuration only
/// (ADAPT_LLM_BASE_URL, ADAPT_LLM_MODEL, ADAPT_LLM_API_KEY in its environment
/// at start): no tool argument can send the key, or ask for code, elsewhere
/// (the schema has no such property and refuses unknown ones).
ToolDef generateTool(const AdaptCommands &commands) {
  ToolDef tool = describedTool("generate", "Generate operator candidates",
                               "Proposes a candidate implementation for every gap of a model "
                               "(reuse rules, then an LLM) into out/candidates for human review "
                               "(`adapt generate`). `complete` is false when some gap has no "
                               "candidate (exit 3). Approval stays with a human: `adapt review`.",
                               Duration::Long);
  tool.inputSchema = objectSchema(
      {{"path", stringProperty("model folder or a gaps.json")},
       {"out", stringProperty("output folder; candidates land in out/candidates")},
       {"registry", registryProperty()},
       {"maxAttempts", {{"type", "integer"}, {"minimum", 1}, {"maximum", 100}}},
       {"target", {{"type", "string"}, {"enum", {"libtorch", "cuda"}}}},
       {"flagSpeedup",
        {{"type", "number"},
         {"exclusiveMinimum", 0},
         {"description", "flag candidates faster than this many times a plain composite (10)"}}},
       {"only", stringProperty("generate for this gap id only")}},
      {"path", "out"});
  tool.outputSchema = commandOutputSchema({{"out", {{"type", "string"}}},
                                           {"complete", {{"type", "boolean"}}},
                                           {"summary", {{"type", "object"}}}});
  tool.handler = [run = commands.generate](const json &arguments, CallContext &context) {
    std::string out = arguments["out"];
    json result = runCommand(run, arguments, context, "generate", {0, 3}, json{{"out", out}});
    return withOutcome(std::move(result), "complete", [&](json &structured) {
      bool ok = false;
      json summary = json::parse(readFile(out + "/generate.json", ok), nullptr, false);
      if (ok && summary.is_object())
        structured["summary"] = summary;
    });
  };
  return tool;
}

/// Makes TOOL resolve its path arguments FIELDS through WORKSPACE first: a
/// path outside the roots is a tool error, and the command sees the resolved
/// absolute path only.
ToolDef confined(ToolDef tool, const Workspace &workspace,
                 std::vector<std::pair<const char *, PathAccess>> fields) {
  auto inner = std::move(tool.handler);
  tool.handler = [inner, workspace, fields](const json &arguments,
                                            CallContext &context) -> json {
    json resolved = arguments;
    for (const auto &[field, access] : fields) {
      if (!arguments.contains(field) || !arguments[field].is_string())
        continue;
      std::string error;
      std::optional<std::string> path =
          workspace.resolve(arguments[field].get<std::string>(), access, error);
      if (!path)
        return toolError(std::string(field) + ": " + error);
      resolved[field] = *path;
    }
    return inner(resolved, context);
  };
  return tool;
}

} // namespace

void addAdaptTools(Registry &registry, const AdaptCommands &commands,
                   const Workspace &workspace) {
  constexpr PathAccess R = PathAccess::Read, W = PathAccess::Write;
  registry.tools.push_back(confined(inspectTool(commands), workspace,
                                    {{"path", R}, {"registry", R}}));
  registry.tools.push_back(confined(gapsTool(commands), workspace,
                                    {{"path", R}, {"out", W}, {"registry", R}}));
  registry.tools.push_back(confined(buildTool(commands), workspace,
                                    {{"path", R}, {"out", W}, {"runtimeDir", R},
                                     {"registry", R}}));
  registry.tools.push_back(confined(validateTool(commands), workspace,
                                    {{"path", R}, {"out", W}, {"fixture", R},
                                     {"runtimeDir", R}}));
  registry.tools.push_back(confined(generateTool(commands), workspace,
                                    {{"path", R}, {"out", W}, {"registry", R}}));
  registry.tools.push_back(confined(listCandidatesTool(), workspace, {{"dir", R}}));
  registry.tools.push_back(confined(showCandidateTool(), workspace, {{"dir", R}}));
  std::string roots;
  for (const std::string &root : workspace.writableRoots())
    roots += (roots.empty() ? "" : ", ") + root;
  for (const std::string &root : workspace.readOnlyRoots())
    roots += ", " + root + " (read-only)";
  registry.instructions =
      "adapt analyses released MoE models and builds LoRA trainers for them. "
      "Paths are on the server's machine and must lie inside its roots: " +
      roots + "; relative paths start at " + workspace.writableRoots().front() + ".";
}

} // namespace adapt::mcp
