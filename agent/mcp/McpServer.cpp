//===- McpServer.cpp - MCP over Streamable HTTP: dispatch -----------------===//
//
// `adapt serve`'s JSON-RPC dispatch and lifecycle; the HTTP half (access,
// sessions, the endpoint's methods) is McpTransport.cpp. One endpoint, /mcp:
//   POST   a JSON-RPC request, notification or response. Requests are
//          answered as application/json, or as text/event-stream for
//          tools/call when the client accepts it (progress, log messages and
//          server-to-client requests travel on that stream).
//   GET    opens the session's standalone SSE stream (server-initiated
//          messages: task status notifications, keep-alive comments).
//   DELETE ends the session named by Mcp-Session-Id (and its GET stream).
// Tool calls may run as tasks (the tasks extension, McpTasks.h).
// Stateful requests (2025-11-25 and older) carry Mcp-Session-Id after
// initialize; stateless ones (2026-07-28) carry _meta on every request.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpServerImpl.h"

#include <csignal>
#include <iostream>
#include <pthread.h>
#include <thread>

namespace adapt::mcp {

json McpServer::capabilities(bool stateless) const {
  // Stateless requests have no session to subscribe on: no subscribe there.
  json caps = {{"tools", json::object()}, {"logging", json::object()}};
  if (!registry.resources.empty())
    caps["resources"] = stateless ? json::object() : json{{"subscribe", true}};
  if (!registry.prompts.empty())
    caps["prompts"] = json::object();
  if (registry.completions)
    caps["completions"] = json::object();
  bool anyTaskTool = false;
  for (const ToolDef &tool : registry.tools)
    anyTaskTool = anyTaskTool || tool.taskSupport != "forbidden";
  if (anyTaskTool)
    caps["extensions"] = {{kTasksExtension, json::object()}};
  return caps;
}

json McpServer::toolList() const {
  json tools = json::array();
  for (const ToolDef &tool : registry.tools) {
    json entry = {{"name", tool.name}, {"inputSchema", tool.inputSchema}};
    putUnlessEmpty(entry, "title", tool.title);
    putUnlessEmpty(entry, "description", tool.description);
    if (!tool.outputSchema.is_null())
      entry["outputSchema"] = tool.outputSchema;
    if (tool.taskSupport != "forbidden")
      entry["execution"] = {{"taskSupport", tool.taskSupport}};
    tools.push_back(entry);
  }
  return tools;
}

/// True when the call's client declared the tasks extension, for the session
/// or (per request) in _meta's clientCapabilities.
static bool callDeclaresTasks(CallContext &context) {
  const json &meta = context.requestMeta();
  return declaresTasks(context.clientCapabilities()) ||
         (meta.contains(kMetaCapabilities) &&
          declaresTasks(meta[kMetaCapabilities]));
}

/// \p tool's handler on \p arguments: its result, or a tool error (isError)
/// carrying what it threw. JSON-RPC errors pass through: they answer the
/// request itself, not the tool call.
static json runHandler(const ToolDef &tool, const json &arguments, CallContext &context) {
  try {
    return tool.handler(arguments, context);
  } catch (const RpcError &) {
    throw;
  } catch (const std::exception &error) {
    return toolError(error.what());
  }
}

json McpServer::startTask(const ToolDef &tool, const json &arguments,
                          const json &params, RequestContext &context,
                          Session *session) {
  const ToolDef *def = &tool;
  auto work = [def, arguments](CallContext &taskContext) -> json {
    return runHandler(*def, arguments, taskContext);
  };
  // The task inherits the call's params without the transport's _meta keys
  // it does not need, and keeps the capabilities it was started with.
  json meta = context.requestMeta();
  json caps = context.clientCapabilities();
  return tasks.create(work, params, meta, caps, session ? session->id : "");
}

json McpServer::callTool(const json &params, RequestContext &context,
                         Session *session) {
  if (!params.contains("name") || !params["name"].is_string())
    throw RpcError(kInvalidParams, "tools/call expects params.name");
  std::string name = params["name"];
  const ToolDef *tool = nullptr;
  for (const ToolDef &candidate : registry.tools)
    if (candidate.name == name)
      tool = &candidate;
  if (!tool)
    throw RpcError(kInvalidParams, "Unknown tool: " + name);
  json arguments = params.value("arguments", json::object());
  if (arguments.is_null())
    arguments = json::object();
  std::string problem = checkArguments(tool->inputSchema, arguments);
  if (!problem.empty())
    return toolError("invalid arguments for " + name + ": " + problem);
  if (tool->taskSupport != "forbidden") {
    if (callDeclaresTasks(context)) {
      if (tool->beforeTask) {
        json early = tool->beforeTask(arguments, context);
        if (!early.is_null())
          return early;
      }
      return startTask(*tool, arguments, params, context, session);
    }
    if (tool->taskSupport == "required")
      throw tasksNotNegotiated("tool " + name);
  }
  return runHandler(*tool, arguments, context);
}

json McpServer::readResource(const json &params, bool stateless) {
  if (!params.contains("uri") || !params["uri"].is_string())
    throw RpcError(kInvalidParams, "resources/read expects params.uri");
  std::string uri = params["uri"];
  for (const ResourceDef &resource : registry.resources) {
    std::map<std::string, std::string> variables;
    if (resource.isTemplate ? matchTemplate(resource.uri, uri, variables)
                            : resource.uri == uri)
      return json{{"contents", resource.read(uri, variables)}};
  }
  // 2026-07-28 (SEP-2164) standardises on -32602; older revisions use -32002.
  throw RpcError(stateless ? kInvalidParams : kResourceNotFound,
                 "Resource not found", json{{"uri", uri}});
}

json McpServer::getPrompt(const json &params, RequestContext &context) {
  std::string name = stringField(params, "name");
  for (const PromptDef &prompt : registry.prompts) {
    if (prompt.name != name)
      continue;
    json arguments = params.value("arguments", json::object());
    for (const json &argument : prompt.arguments)
      if (argument.value("required", false) &&
          !arguments.contains(stringField(argument, "name")))
        throw RpcError(kInvalidParams, "missing required argument \"" +
                                           stringField(argument, "name") + "\"");
    return prompt.render(arguments, context);
  }
  throw RpcError(kInvalidParams, "Unknown prompt: " + name);
}

json McpServer::dispatch(const std::string &method, const json &params,
                         RequestContext &context, Session *session,
                         bool stateless) {
  if (method == "ping" && !stateless)
    return json::object();
  if (method == "server/discover" && stateless) {
    json versions = json::array({kStateless});
    for (const char *version : kStatefulVersions)
      versions.push_back(version);
    return json{{"supportedVersions", versions},
                {"capabilities", capabilities(true)},
                {"serverInfo", serverInfo()},
                {"instructions", registry.instructions},
                {"_meta", {{kMetaServerInfo, serverInfo()}}}};
  }
  if (method == "tools/list")
    return json{{"tools", toolList()}};
  if (method == "tools/call")
    return callTool(params, context, session);
  if (method == "tasks/get" || method == "tasks/update" ||
      method == "tasks/cancel")
    return taskMethod(method, params, context);
  if (method == "resources/list" || method == "resources/templates/list") {
    bool templates = method == "resources/templates/list";
    json list = json::array();
    for (const ResourceDef &resource : registry.resources) {
      if (resource.isTemplate != templates)
        continue;
      json entry = {{templates ? "uriTemplate" : "uri", resource.uri},
                    {"name", resource.name}};
      putUnlessEmpty(entry, "title", resource.title);
      putUnlessEmpty(entry, "description", resource.description);
      putUnlessEmpty(entry, "mimeType", resource.mimeType);
      list.push_back(entry);
    }
    return json{{templates ? "resourceTemplates" : "resources", list}};
  }
  if (method == "resources/read")
    return readResource(params, stateless);
  if ((method == "resources/subscribe" || method == "resources/unsubscribe") &&
      !stateless && !registry.resources.empty()) {
    if (!params.contains("uri") || !params["uri"].is_string())
      throw RpcError(kInvalidParams, method + " expects params.uri");
    return json::object();
  }
  if (method == "prompts/list") {
    json list = json::array();
    for (const PromptDef &prompt : registry.prompts) {
      json entry = {{"name", prompt.name}};
      putUnlessEmpty(entry, "title", prompt.title);
      putUnlessEmpty(entry, "description", prompt.description);
      putUnlessEmpty(entry, "arguments", prompt.arguments);
      list.push_back(entry);
    }
    return json{{"prompts", list}};
  }
  if (method == "prompts/get")
    return getPrompt(params, context);
  if (method == "completion/complete" && registry.completions)
    return json{{"completion",
                 {{"values", json::array()}, {"total", 0}, {"hasMore", false}}}};
  if (method == "logging/setLevel" && session) {
    int index = logLevelIndex(stringField(params, "level"));
    if (index < 0)
      throw RpcError(kInvalidParams, "unknown log level");
    session->logLevel = index;
    return json::object();
  }
  throw RpcError(kMethodNotFound, "Method not found: " + method);
}

json McpServer::taskMethod(const std::string &method, const json &params,
                           RequestContext &context) {
  if (!callDeclaresTasks(context))
    throw tasksNotNegotiated(method);
  if (!params.contains("taskId") || !params["taskId"].is_string())
    throw RpcError(kInvalidParams, method + " expects params.taskId (a string)");
  std::string taskId = params["taskId"];
  if (method == "tasks/get")
    return tasks.get(taskId);
  if (method == "tasks/update") {
    if (!params.contains("inputResponses") ||
        !params["inputResponses"].is_object())
      throw RpcError(kInvalidParams,
                     "tasks/update expects params.inputResponses (an object)");
    tasks.update(taskId, params["inputResponses"]);
  } else {
    tasks.cancel(taskId);
  }
  return json{{"resultType", "complete"}};
}

void McpServer::shutdown() {
  stopping = true;
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(sessionsMutex);
    for (auto &entry : sessions)
      all.push_back(entry.second);
  }
  for (auto &session : all) {
    {
      std::lock_guard<std::mutex> lock(session->streamMutex);
      session->streamWake.notify_all();
    }
    std::lock_guard<std::mutex> lock(session->mutex);
    for (auto &flag : session->inFlight)
      flag.second->store(true);
  }
  tasks.shutdown();
}

int serve(const ServeOptions &options, const Registry &registry) {
  // Signals go to one thread, which stops the server cleanly.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  httplib::Server http;
  int threads = options.threads;
  // Created once bound (it needs the listening socket), before httplib's
  // accept loop asks for its task queue.
  std::unique_ptr<ConnectionGuard> guard;
  http.new_task_queue = [&guard, threads] { return guard->newTaskQueue(threads); };
  http.set_logger([](const httplib::Request &, const httplib::Response &) {
    ConnectionGuard::responseWritten();
  });
  http.set_payload_max_length(options.maxBodyBytes);
  http.set_keep_alive_max_count(1000);
  http.set_read_timeout(30, 0);
  McpServer server(options, registry);
  server.install(http);
  // cpp-httplib listens with a backlog of 5, too small for a burst of
  // clients (the kernel resets the rest): note the listening socket, and
  // listen again on it with the system's maximum once bound.
  int listeningSocket = -1;
  http.set_socket_options([&listeningSocket](socket_t sock) {
    httplib::default_socket_options(sock);
    listeningSocket = sock;
  });

  int port = options.port;
  if (port == 0)
    port = http.bind_to_any_port(options.host);
  else if (!http.bind_to_port(options.host, port))
    port = -1;
  if (port <= 0) {
    std::cerr << "adapt: error: cannot listen on " << options.host << ":"
              << options.port << "\n";
    return 2;
  }
  if (listeningSocket >= 0)
    ::listen(listeningSocket, SOMAXCONN);
  guard = std::make_unique<ConnectionGuard>(options.limits, listeningSocket);
  std::string shown = options.host.find(':') != std::string::npos
                          ? "[" + options.host + "]"
                          : options.host;
  std::cout << "listening on http://" << shown << ":" << port << "/mcp"
            << std::endl;
  std::thread waiter([&http, &server, signals] {
    int received = 0;
    sigwait(&signals, &received);
    // Open GET streams and running tasks first, or httplib's stop() would
    // wait for their worker threads forever.
    server.shutdown();
    http.stop();
  });
  bool ok = http.listen_after_bind();
  // Wake the waiter (a no-op when a signal already did) and wait for it.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return ok ? 0 : 2;
}

} // namespace adapt::mcp