//===- McpServer.cpp - MCP over Streamable HTTP ---------------------------===//
//
// Transport (cpp-httplib), sessions and JSON-RPC dispatch of `adapt serve`.
// One endpoint, /mcp:
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

#include "agent/mcp/McpServer.h"
#include "agent/mcp/McpProtocol.h"
#include "agent/mcp/McpParamHeaders.h"
#include "agent/mcp/McpTasks.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <iterator>
#include <csignal>
#include <iostream>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <sys/socket.h>
#include <random>
#include <thread>
#include <unordered_map>

namespace adapt::mcp {

namespace {

constexpr const char *kLatestStateful = "2025-11-25";
constexpr const char *kStateless = "2026-07-28";
const char *const kStatefulVersions[] = {"2025-11-25", "2025-06-18",
                                         "2025-03-26", "2024-11-05"};
constexpr const char *kMetaVersion = "io.modelcontextprotocol/protocolVersion";
constexpr const char *kMetaCapabilities =
    "io.modelcontextprotocol/clientCapabilities";
constexpr const char *kMetaLogLevel = "io.modelcontextprotocol/logLevel";
constexpr const char *kMetaServerInfo = "io.modelcontextprotocol/serverInfo";

const char *const kLogLevels[] = {"debug",    "info",  "notice",
                                  "warning",  "error", "critical",
                                  "alert",    "emergency"};

/// Index of LEVEL in kLogLevels, or -1 when it is not a level.
int logLevelIndex(const std::string &level) {
  for (int i = 0; i < 8; ++i)
    if (level == kLogLevels[i])
      return i;
  return -1;
}

json serverInfo() {
  return json{{"name", "adapt"}, {"title", "adapt MoE LoRA toolchain"},
              {"version", "0.1.0"}};
}

/// Seconds on the steady clock.
int64_t nowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Sessions unused this long (and with nothing running) are forgotten.
constexpr int64_t kSessionIdleSeconds = 3600;

/// A reply the server waits for: the client's answer to a server request.
struct PendingReply {
  std::mutex mutex;
  std::condition_variable ready;
  bool done = false;
  json message;
};

/// One stateful session (2025-11-25 and older).
struct Session {
  std::string id, protocolVersion;
  json clientCapabilities = json::object();
  std::mutex mutex;
  std::atomic<int> logLevel{0}; ///< minimum level sent (index into kLogLevels)
  /// When the session was last used (steady clock), for idle expiry.
  std::atomic<int64_t> lastUsedSeconds{0};
  std::unordered_map<std::string, std::shared_ptr<PendingReply>> pending;
  std::unordered_map<std::string, std::shared_ptr<std::atomic<bool>>> inFlight;
  /// The standalone GET streams: how many are open, the messages waiting
  /// (each goes to exactly one stream), and whether the session ended
  /// (DELETE) so the streams must close.
  std::mutex streamMutex;
  std::condition_variable streamWake;
  int openStreams = 0;
  bool ended = false;
  std::deque<std::string> outbox;
};

/// Most GET streams open at once per session (each holds a worker thread).
constexpr int kMaxStreamsPerSession = 4;
/// Seconds between keep-alive comments on an idle GET stream.
constexpr int kKeepAliveSeconds = 10;
/// Most messages queued for a GET stream; older ones are dropped beyond it.
constexpr size_t kMaxOutbox = 1000;

/// Writes JSON-RPC messages on an SSE stream; null sink: JSON mode, where
/// notifications have nowhere to go and are dropped.
class Emitter {
public:
  explicit Emitter(httplib::DataSink *sink) : sink(sink) {}
  bool streaming() const { return sink != nullptr; }
  /// Sends MESSAGE as one SSE event; false once the client has gone.
  bool send(const json &message) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sink || broken)
      return false;
    std::string event = "id: " + std::to_string(++eventId) +
                        "\nevent: message\ndata: " + serialise(message) + "\n\n";
    if (!sink->is_writable() || !sink->write(event.data(), event.size()))
      broken = true;
    return !broken;
  }
  bool gone() const { return broken; }

private:
  httplib::DataSink *sink;
  std::mutex mutex;
  unsigned long eventId = 0;
  bool broken = false;
};

/// The CallContext of one request.
class RequestContext : public CallContext {
public:
  RequestContext(Emitter &emitter, std::shared_ptr<Session> session,
                 json params, json meta, json capabilities, int logLevel,
                 std::shared_ptr<std::atomic<bool>> cancelFlag)
      : emitter(emitter), session(std::move(session)),
        params(std::move(params)), meta(std::move(meta)),
        capabilities(std::move(capabilities)), logLevel(logLevel),
        cancelFlag(std::move(cancelFlag)) {}

  void progress(double progress, std::optional<double> total,
                const std::string &message) override {
    if (!meta.contains("progressToken"))
      return;
    json params = {{"progressToken", meta["progressToken"]},
                   {"progress", progress}};
    if (total)
      params["total"] = *total;
    if (!message.empty())
      params["message"] = message;
    emitter.send(json{{"jsonrpc", "2.0"},
                      {"method", "notifications/progress"},
                      {"params", params}});
  }

  void log(const std::string &level, const json &data) override {
    int index = logLevelIndex(level);
    int threshold = session ? session->logLevel.load() : logLevel;
    if (index < 0 || threshold < 0 || index < threshold)
      return;
    emitter.send(json{{"jsonrpc", "2.0"},
                      {"method", "notifications/message"},
                      {"params", {{"level", level},
                                  {"logger", "adapt"},
                                  {"data", data}}}});
  }

  json requestClient(const std::string &method, const json &params) override {
    if (!session || !emitter.streaming())
      throw RpcError(kInternalError,
                     "cannot send " + method +
                         " to this client: it needs a session and an SSE "
                         "stream (Accept: text/event-stream)");
    std::string id = "adapt-" + randomHex(8);
    auto reply = std::make_shared<PendingReply>();
    {
      std::lock_guard<std::mutex> lock(session->mutex);
      session->pending[json(id).dump()] = reply;
    }
    auto forget = [&] {
      std::lock_guard<std::mutex> lock(session->mutex);
      session->pending.erase(json(id).dump());
    };
    if (!emitter.send(json{{"jsonrpc", "2.0"},
                           {"id", id},
                           {"method", method},
                           {"params", params}})) {
      forget();
      throw RpcError(kInternalError, "the client went away");
    }
    std::unique_lock<std::mutex> lock(reply->mutex);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!reply->done) {
      if (cancelled() || std::chrono::steady_clock::now() > deadline) {
        lock.unlock();
        forget();
        throw RpcError(kInternalError, method + " got no answer");
      }
      reply->ready.wait_for(lock, std::chrono::milliseconds(100));
    }
    json message = reply->message;
    lock.unlock();
    forget();
    if (message.contains("error"))
      throw RpcError(integerField(message["error"], "code", kInternalError),
                     message["error"].is_object() && message["error"]["message"].is_string()
                         ? message["error"]["message"].get<std::string>()
                         : std::string("client error"));
    return message.value("result", json::object());
  }

  bool cancelled() const override {
    return (cancelFlag && cancelFlag->load()) || emitter.gone();
  }
  const json &clientCapabilities() const override { return capabilities; }
  const json &requestMeta() const override { return meta; }
  const json &requestParams() const override { return params; }
  bool stateless() const override { return !session; }

private:
  Emitter &emitter;
  std::shared_ptr<Session> session;
  json params, meta, capabilities;
  int logLevel;
  std::shared_ptr<std::atomic<bool>> cancelFlag;
};

/// The server proper: registry, sessions, dispatch.
class McpServer {
public:
  McpServer(const ServeOptions &options, const Registry &registry)
      : options(options), registry(registry),
        tasks([this](const std::string &sessionId, const json &message) {
          sendToSession(sessionId, message);
        }) {}

  void install(httplib::Server &http);
  /// Closes every GET stream and cancels every task, so that the HTTP
  /// server's worker threads can finish: call before httplib's stop().
  void shutdown();

private:
  const ServeOptions &options;
  const Registry &registry;
  std::mutex sessionsMutex;
  std::unordered_map<std::string, std::shared_ptr<Session>> sessions;
  TaskStore tasks;
  std::atomic<bool> stopping{false};

  /// Queues MESSAGE for the GET stream of session SESSIONID (dropped when
  /// the session is gone).
  void sendToSession(const std::string &sessionId, const json &message);
  void handleGet(const httplib::Request &request, httplib::Response &response);
  /// tasks/get, tasks/update, tasks/cancel.
  json taskMethod(const std::string &method, const json &params,
                  RequestContext &context);
  /// Runs TOOL as a task and returns the CreateTaskResult.
  json startTask(const ToolDef &tool, const json &arguments,
                 const json &params, RequestContext &context,
                 Session *session);

  json capabilities(bool stateless) const;
  json toolList() const;
  /// Runs one request; throws RpcError for protocol errors.
  json dispatch(const std::string &method, const json &params,
                RequestContext &context, Session *session, bool stateless);
  json callTool(const json &params, RequestContext &context, Session *session);
  json readResource(const json &params, bool stateless);
  json getPrompt(const json &params, RequestContext &context);

  bool hostAllowed(const std::string &hostname) const;
  bool checkAccess(const httplib::Request &request, httplib::Response &response);
  void handlePost(const httplib::Request &request, httplib::Response &response);
  void handleDelete(const httplib::Request &request,
                    httplib::Response &response);
  std::shared_ptr<Session> findSession(const std::string &id);
  /// Drops sessions idle for kSessionIdleSeconds (clients that never DELETE).
  void forgetIdleSessions();
  void answer(const httplib::Request &request, httplib::Response &response,
              const json &message, std::shared_ptr<Session> session,
              bool stateless);
};

void sendJson(httplib::Response &response, int status, const json &body) {
  response.status = status;
  response.set_content(serialise(body), "application/json");
}

/// Sets \p key of the listing \p entry to \p value unless the value is
/// empty: optional fields (title, description, ...) are left out, not sent empty.
template <typename T>
void putUnlessEmpty(json &entry, const char *key, const T &value) {
  if (!value.empty())
    entry[key] = value;
}

/// False, after answering 404 with JSON-RPC error -32001 for request
/// \p requestId, when \p session is null (an unknown or expired
/// Mcp-Session-Id): every handler that needs a session stops there.
bool sessionFound(const std::shared_ptr<Session> &session, httplib::Response &response,
                  const json &requestId = nullptr) {
  if (session)
    return true;
  sendJson(response, 404, rpcError(requestId, -32001, "Session not found"));
  return false;
}

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
bool callDeclaresTasks(CallContext &context) {
  const json &meta = context.requestMeta();
  return declaresTasks(context.clientCapabilities()) ||
         (meta.contains(kMetaCapabilities) &&
          declaresTasks(meta[kMetaCapabilities]));
}

json McpServer::startTask(const ToolDef &tool, const json &arguments,
                          const json &params, RequestContext &context,
                          Session *session) {
  const ToolDef *def = &tool;
  auto work = [def, arguments](CallContext &taskContext) -> json {
    try {
      return def->handler(arguments, taskContext);
    } catch (const RpcError &) {
      throw;
    } catch (const std::exception &error) {
      return toolError(error.what());
    }
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
  try {
    return tool->handler(arguments, context);
  } catch (const RpcError &) {
    throw;
  } catch (const std::exception &error) {
    return toolError(error.what());
  }
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

void McpServer::sendToSession(const std::string &sessionId,
                              const json &message) {
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(sessionsMutex);
    auto it = sessions.find(sessionId);
    if (it == sessions.end())
      return;
    session = it->second;
  }
  std::lock_guard<std::mutex> lock(session->streamMutex);
  if (session->outbox.size() >= kMaxOutbox)
    session->outbox.pop_front();
  session->outbox.push_back(serialise(message));
  session->streamWake.notify_all();
}

void McpServer::handleGet(const httplib::Request &request,
                          httplib::Response &response) {
  std::string id = request.get_header_value("Mcp-Session-Id");
  if (id.empty()) {
    response.set_header("Allow", "POST, DELETE");
    sendJson(response, 405,
             rpcError(nullptr, kInvalidRequest,
                      "Method Not Allowed: the standalone stream belongs to a "
                      "session (2025-11-25); send Mcp-Session-Id"));
    return;
  }
  std::shared_ptr<Session> session = findSession(id);
  if (!sessionFound(session, response))
    return;
  if (request.get_header_value("Accept").find("text/event-stream") ==
      std::string::npos) {
    sendJson(response, 406,
             rpcError(nullptr, kInvalidRequest,
                      "Not Acceptable: GET opens an SSE stream (Accept: "
                      "text/event-stream)"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(session->streamMutex);
    if (session->openStreams >= kMaxStreamsPerSession) {
      sendJson(response, 409,
               rpcError(nullptr, kInvalidRequest,
                        "Conflict: this session already has " +
                            std::to_string(kMaxStreamsPerSession) +
                            " GET streams open"));
      return;
    }
    ++session->openStreams;
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_header("Mcp-Session-Id", session->id);
  // The connection ends with the stream: a kept-alive idle connection would
  // hold its worker thread (and shutdown) for the keep-alive timeout.
  response.set_header("Connection", "close");
  response.set_chunked_content_provider(
      "text/event-stream",
      [this, session](size_t, httplib::DataSink &sink) {
        auto write = [&sink](const std::string &text) {
          return sink.is_writable() && sink.write(text.data(), text.size());
        };
        unsigned long eventId = 0;
        bool alive = write(": stream open\n\n");
        std::unique_lock<std::mutex> lock(session->streamMutex);
        while (alive && !session->ended && !stopping) {
          if (session->outbox.empty()) {
            bool woken = session->streamWake.wait_for(
                lock, std::chrono::seconds(kKeepAliveSeconds), [&] {
                  return !session->outbox.empty() || session->ended ||
                         stopping;
                });
            if (!woken) {
              lock.unlock();
              alive = write(": keep-alive\n\n");
              lock.lock();
            }
            continue;
          }
          std::string data = std::move(session->outbox.front());
          session->outbox.pop_front();
          lock.unlock();
          alive = write("id: get-" + std::to_string(++eventId) +
                        "\nevent: message\ndata: " + data + "\n\n");
          lock.lock();
        }
        lock.unlock();
        sink.done();
        return true;
      },
      // Called once whatever happened to the response: the one place the
      // stream stops counting.
      [session](bool) {
        std::lock_guard<std::mutex> lock(session->streamMutex);
        --session->openStreams;
      });
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

bool McpServer::hostAllowed(const std::string &hostname) const {
  if (hostname == "localhost" || hostname == "127.0.0.1" ||
      hostname == "[::1]" || hostname == "::1")
    return true;
  for (const std::string &allowed : options.allowedHosts)
    if (hostname == allowed)
      return true;
  return false;
}

/// The host name of a Host header value ("h:p", "[v6]:p").
std::string hostName(const std::string &host) {
  if (!host.empty() && host[0] == '[') {
    size_t close = host.find(']');
    return close == std::string::npos ? host : host.substr(0, close + 1);
  }
  size_t colon = host.rfind(':');
  return colon == std::string::npos ? host : host.substr(0, colon);
}

bool McpServer::checkAccess(const httplib::Request &request,
                            httplib::Response &response) {
  std::string host = request.get_header_value("Host");
  if (host.empty() || !hostAllowed(hostName(host))) {
    sendJson(response, 403,
             rpcError(nullptr, kInvalidRequest, "Forbidden: Host not allowed"));
    return false;
  }
  if (request.has_header("Origin")) {
    std::string origin = request.get_header_value("Origin");
    size_t scheme = origin.find("://");
    std::string rest =
        scheme == std::string::npos ? "" : origin.substr(scheme + 3);
    rest = rest.substr(0, rest.find('/'));
    if (origin != "null" && (rest.empty() || !hostAllowed(hostName(rest)))) {
      sendJson(response, 403, rpcError(nullptr, kInvalidRequest,
                                       "Forbidden: Origin not allowed"));
      return false;
    }
    if (origin == "null") {
      sendJson(response, 403, rpcError(nullptr, kInvalidRequest,
                                       "Forbidden: Origin not allowed"));
      return false;
    }
  }
  if (!options.bearerToken.empty() &&
      request.get_header_value("Authorization") !=
          "Bearer " + options.bearerToken) {
    response.set_header("WWW-Authenticate", "Bearer realm=\"adapt\"");
    sendJson(response, 401,
             rpcError(nullptr, kInvalidRequest, "Unauthorized: bearer token required"));
    return false;
  }
  return true;
}

std::shared_ptr<Session> McpServer::findSession(const std::string &id) {
  std::lock_guard<std::mutex> lock(sessionsMutex);
  auto it = sessions.find(id);
  if (it == sessions.end())
    return nullptr;
  it->second->lastUsedSeconds = nowSeconds();
  return it->second;
}

void McpServer::forgetIdleSessions() {
  int64_t now = nowSeconds();
  std::lock_guard<std::mutex> lock(sessionsMutex);
  for (auto it = sessions.begin(); it != sessions.end();) {
    Session &session = *it->second;
    bool idle = now - session.lastUsedSeconds > kSessionIdleSeconds;
    bool busy = false;
    if (idle) {
      std::lock_guard<std::mutex> sessionLock(session.mutex);
      busy = !session.inFlight.empty() || !session.pending.empty();
      std::lock_guard<std::mutex> streamLock(session.streamMutex);
      busy = busy || session.openStreams > 0;
    }
    it = idle && !busy ? sessions.erase(it) : std::next(it);
  }
}

void McpServer::handleDelete(const httplib::Request &request,
                             httplib::Response &response) {
  std::string id = request.get_header_value("Mcp-Session-Id");
  if (id.empty()) {
    sendJson(response, 400,
             rpcError(nullptr, kInvalidRequest, "Bad Request: Mcp-Session-Id required"));
    return;
  }
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(sessionsMutex);
    auto it = sessions.find(id);
    if (it != sessions.end()) {
      session = it->second;
      sessions.erase(it);
    }
  }
  if (!sessionFound(session, response))
    return;
  {
    std::lock_guard<std::mutex> lock(session->mutex);
    for (auto &flag : session->inFlight)
      flag.second->store(true);
  }
  {
    std::lock_guard<std::mutex> lock(session->streamMutex);
    session->ended = true;
    session->streamWake.notify_all();
  }
  response.status = 200;
}

/// Validates the stateless (2026-07-28) envelope; returns an HTTP status and
/// error message for a request it rejects, or 0.
int checkStateless(const httplib::Request &request, const json &message,
                   json &error) {
  const json &id = message.contains("id") ? message["id"] : json(nullptr);
  std::string method = stringField(message, "method");
  json params = message.value("params", json::object());
  if (!params.is_object() || !params.contains("_meta") ||
      !params["_meta"].is_object()) {
    error = rpcError(id, kInvalidParams, "Invalid params: _meta is required");
    return 400;
  }
  const json &meta = params["_meta"];
  if (!meta.contains(kMetaVersion) || !meta[kMetaVersion].is_string() ||
      !meta.contains(kMetaCapabilities) || !meta[kMetaCapabilities].is_object()) {
    error = rpcError(id, kInvalidParams,
                     "Invalid params: _meta needs protocolVersion and "
                     "clientCapabilities");
    return 400;
  }
  std::string version = meta[kMetaVersion];
  std::string header = request.get_header_value("MCP-Protocol-Version");
  if (header != version) {
    error = rpcError(id, kHeaderMismatch,
                     "Header mismatch: MCP-Protocol-Version does not match "
                     "_meta protocolVersion");
    return 400;
  }
  if (version != kStateless) {
    json supported = json::array({kStateless});
    error = rpcError(id, kInvalidParams, "Unsupported protocol version",
                     json{{"supported", supported}, {"requested", version}});
    return 400;
  }
  // The routing headers must be present and agree with the body, so that
  // intermediaries can route on them safely.
  if (request.get_header_value("Mcp-Method") != method) {
    error = rpcError(id, kHeaderMismatch,
                     request.has_header("Mcp-Method")
                         ? "Header mismatch: Mcp-Method does not match the body"
                         : "Header mismatch: Mcp-Method header is required");
    return 400;
  }
  const char *nameKey =
      method == "tools/call" || method == "prompts/get" ? "name"
      : method == "resources/read"                      ? "uri"
      : method == "tasks/get" || method == "tasks/update" ||
              method == "tasks/cancel"
          ? "taskId"
          : nullptr;
  if (nameKey && params.contains(nameKey) && params[nameKey].is_string() &&
      request.get_header_value("Mcp-Name") != params[nameKey].get<std::string>()) {
    error = rpcError(id, kHeaderMismatch,
                     request.has_header("Mcp-Name")
                         ? "Header mismatch: Mcp-Name does not match the body"
                         : "Header mismatch: Mcp-Name header is required");
    return 400;
  }
  return 0;
}

void McpServer::handlePost(const httplib::Request &request,
                           httplib::Response &response) {
  std::string contentType = request.get_header_value("Content-Type");
  if (contentType.find("application/json") == std::string::npos) {
    sendJson(response, 415, rpcError(nullptr, kInvalidRequest,
                                     "Unsupported Media Type: expected "
                                     "application/json"));
    return;
  }
  json message;
  try {
    message = parseBounded(request.body);
  } catch (const std::exception &error) {
    sendJson(response, 400, rpcError(nullptr, kParseError,
                                     std::string("Parse error: ") + error.what()));
    return;
  }
  if (message.is_array()) {
    sendJson(response, 400, rpcError(nullptr, kInvalidRequest,
                                     "Invalid Request: batches are not "
                                     "supported"));
    return;
  }
  const json id = message.is_object() && message.contains("id")
                      ? message["id"]
                      : json(nullptr);
  bool validId = id.is_null() || id.is_string() || id.is_number_integer();
  if (!message.is_object() || stringField(message, "jsonrpc") != "2.0" ||
      !validId ||
      (message.contains("method") && !message["method"].is_string()) ||
      (message.contains("params") && !message["params"].is_object() &&
       !message["params"].is_array())) {
    sendJson(response, 400,
             rpcError(validId ? id : json(nullptr), kInvalidRequest,
                      "Invalid Request"));
    return;
  }
  bool isRequest = message.contains("method") && message.contains("id");
  bool isNotification = message.contains("method") && !message.contains("id");
  bool isReply = !message.contains("method") && message.contains("id") &&
                 (message.contains("result") || message.contains("error"));
  if (!isRequest && !isNotification && !isReply) {
    sendJson(response, 400, rpcError(id, kInvalidRequest, "Invalid Request"));
    return;
  }
  if (isRequest && id.is_null()) {
    sendJson(response, 400,
             rpcError(nullptr, kInvalidRequest, "Invalid Request: null id"));
    return;
  }
  std::string method = stringField(message, "method");
  json params = message.contains("params") && message["params"].is_object()
                    ? message["params"]
                    : json::object();

  std::string sessionId = request.get_header_value("Mcp-Session-Id");
  std::string versionHeader = request.get_header_value("MCP-Protocol-Version");
  bool metaVersion = params.contains("_meta") && params["_meta"].is_object() &&
                     params["_meta"].contains(kMetaVersion);
  bool stateless =
      sessionId.empty() && (versionHeader == kStateless || metaVersion ||
                            (method != "initialize" && versionHeader.empty() &&
                             isRequest && method == "server/discover"));

  if (stateless) {
    if (isNotification || isReply) {
      response.status = 202;
      return;
    }
    json error;
    if (int status = checkStateless(request, message, error)) {
      sendJson(response, status, error);
      return;
    }
    if (method == "tools/call") {
      // Arguments mirrored in Mcp-Param-* headers must agree (SEP-2243).
      for (const ToolDef &tool : registry.tools) {
        if (tool.name != stringField(params, "name"))
          continue;
        std::string problem = checkParamHeaders(
            tool.inputSchema, params.value("arguments", json::object()),
            [&request](const std::string &name) -> std::optional<std::string> {
              if (!request.has_header(name))
                return std::nullopt;
              return request.get_header_value(name);
            });
        if (!problem.empty()) {
          sendJson(response, 400,
                   rpcError(id, kHeaderMismatch,
                            "Header mismatch: " + problem));
          return;
        }
      }
    }
    answer(request, response, message, nullptr, true);
    return;
  }

  if (method == "initialize" && isRequest) {
    if (!sessionId.empty()) {
      sendJson(response, 400, rpcError(id, kInvalidRequest,
                                       "Invalid Request: already initialised"));
      return;
    }
    forgetIdleSessions();
    auto session = std::make_shared<Session>();
    session->id = randomHex(16);
    session->lastUsedSeconds = nowSeconds();
    std::string requested = stringField(params, "protocolVersion");
    session->protocolVersion = kLatestStateful;
    for (const char *version : kStatefulVersions)
      if (requested == version)
        session->protocolVersion = version;
    session->clientCapabilities =
        params.value("capabilities", json::object());
    {
      std::lock_guard<std::mutex> lock(sessionsMutex);
      sessions[session->id] = session;
    }
    json result = {{"protocolVersion", session->protocolVersion},
                   {"capabilities", capabilities(false)},
                   {"serverInfo", serverInfo()}};
    putUnlessEmpty(result, "instructions", registry.instructions);
    response.set_header("Mcp-Session-Id", session->id);
    sendJson(response, 200, rpcResult(id, result));
    return;
  }
  if (sessionId.empty()) {
    sendJson(response, 400,
             rpcError(id, kInvalidRequest,
                      "Bad Request: Mcp-Session-Id required (send initialize "
                      "first)"));
    return;
  }
  std::shared_ptr<Session> session = findSession(sessionId);
  if (!sessionFound(session, response, id))
    return;
  if (!versionHeader.empty()) {
    bool known = false;
    for (const char *version : kStatefulVersions)
      known = known || versionHeader == version;
    if (!known) {
      sendJson(response, 400, rpcError(id, kInvalidRequest,
                                       "Bad Request: unsupported "
                                       "MCP-Protocol-Version " +
                                           versionHeader));
      return;
    }
  }
  if (isReply) {
    std::shared_ptr<PendingReply> reply;
    {
      std::lock_guard<std::mutex> lock(session->mutex);
      auto it = session->pending.find(id.dump());
      if (it != session->pending.end())
        reply = it->second;
    }
    if (reply) {
      std::lock_guard<std::mutex> lock(reply->mutex);
      reply->message = message;
      reply->done = true;
      reply->ready.notify_all();
    }
    response.status = 202;
    return;
  }
  if (isNotification) {
    if (method == "notifications/cancelled") {
      json requestId = params.value("requestId", json(nullptr));
      std::lock_guard<std::mutex> lock(session->mutex);
      auto it = session->inFlight.find(requestId.dump());
      if (it != session->inFlight.end())
        it->second->store(true);
    }
    response.status = 202;
    return;
  }
  answer(request, response, message, session, false);
}

void McpServer::answer(const httplib::Request &request,
                       httplib::Response &response, const json &message,
                       std::shared_ptr<Session> session, bool stateless) {
  json id = message["id"];
  std::string method = message["method"];
  json params = message.contains("params") && message["params"].is_object()
                    ? message["params"]
                    : json::object();
  json meta = params.contains("_meta") && params["_meta"].is_object()
                  ? params["_meta"]
                  : json::object();
  json caps = session ? session->clientCapabilities
                      : meta.value(kMetaCapabilities, json::object());
  int logLevel = -1; // stateless: no messages unless _meta asks for them
  if (stateless && meta.contains(kMetaLogLevel) &&
      meta[kMetaLogLevel].is_string())
    logLevel = logLevelIndex(meta[kMetaLogLevel]);
  if (session)
    response.set_header("Mcp-Session-Id", session->id);

  if (stateless && method == "tools/call") {
    json missing = json::object();
    for (const ToolDef &tool : registry.tools)
      if (tool.name == stringField(params, "name"))
        for (auto it = tool.requiredCapabilities.begin();
             it != tool.requiredCapabilities.end(); ++it)
          if (!caps.is_object() || !caps.contains(it.key()))
            missing[it.key()] = it.value();
    for (const ToolDef &tool : registry.tools)
      if (tool.name == stringField(params, "name") &&
          tool.taskSupport == "required" && !declaresTasks(caps))
        missing["extensions"] = {{kTasksExtension, json::object()}};
    if (!missing.empty()) {
      sendJson(response, 400,
               rpcError(id, kMissingClientCapability,
                        "Missing required client capability",
                        json{{"requiredCapabilities", missing}}));
      return;
    }
  }

  auto cancelFlag = std::make_shared<std::atomic<bool>>(false);
  std::string key = id.dump();
  if (session) {
    std::lock_guard<std::mutex> lock(session->mutex);
    session->inFlight[key] = cancelFlag;
  }
  auto finish = [session, key] {
    if (!session)
      return;
    std::lock_guard<std::mutex> lock(session->mutex);
    session->inFlight.erase(key);
  };
  auto run = [this, method, params, id, session, stateless](
                 RequestContext &context) -> json {
    try {
      json result = dispatch(method, params, context, session.get(), stateless);
      // 2026-07-28: every result says whether it is complete, and the
      // cacheable ones how long and for whom they may be cached.
      if (stateless && result.is_object() && !result.contains("resultType"))
        result["resultType"] = "complete";
      if (stateless && stringField(result, "resultType") == "complete") {
        if (method == "tools/list" || method == "prompts/list" ||
            method == "resources/list" ||
            method == "resources/templates/list" ||
            method == "server/discover") {
          result["ttlMs"] = 60000;
          result["cacheScope"] = "public";
        } else if (method == "resources/read") {
          result["ttlMs"] = 0;
          result["cacheScope"] = "private";
        }
      }
      return rpcResult(id, result);
    } catch (const RpcError &error) {
      return rpcError(id, error.code, error.what(), error.data);
    } catch (const std::exception &error) {
      return rpcError(id, kInternalError, error.what());
    }
  };

  std::string accept = request.get_header_value("Accept");
  bool sse = method == "tools/call" &&
             accept.find("text/event-stream") != std::string::npos;
  if (!sse) {
    Emitter none(nullptr);
    RequestContext context(none, session, params, meta, caps, logLevel,
                           cancelFlag);
    json reply = run(context);
    finish();
    int status = 200;
    if (stateless && reply.contains("error") &&
        reply["error"].value("code", 0) == kMethodNotFound)
      status = 404;
    if (stateless && reply.contains("error") &&
        reply["error"].value("code", 0) == kMissingClientCapability)
      status = 400;
    sendJson(response, status, reply);
    return;
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [run, session, params, meta, caps, logLevel, cancelFlag,
       finish](size_t, httplib::DataSink &sink) {
        Emitter emitter(&sink);
        RequestContext context(emitter, session, params, meta, caps, logLevel,
                               cancelFlag);
        json reply = run(context);
        finish();
        if (!cancelFlag->load())
          emitter.send(reply);
        sink.done();
        return true;
      });
}

void McpServer::install(httplib::Server &http) {
  http.set_pre_routing_handler(
      [this](const httplib::Request &request, httplib::Response &response) {
        return checkAccess(request, response)
                   ? httplib::Server::HandlerResponse::Unhandled
                   : httplib::Server::HandlerResponse::Handled;
      });
  http.Post("/mcp", [this](const httplib::Request &request,
                           httplib::Response &response) {
    ConnectionGuard::requestRead();
    handlePost(request, response);
  });
  http.Get("/mcp", [this](const httplib::Request &request,
                          httplib::Response &response) {
    ConnectionGuard::requestRead();
    handleGet(request, response);
  });
  http.Delete("/mcp", [this](const httplib::Request &request,
                             httplib::Response &response) {
    ConnectionGuard::requestRead();
    handleDelete(request, response);
  });
  http.set_error_handler(
      [](const httplib::Request &, httplib::Response &response) {
        if (!response.body.empty())
          return;
        std::string message = response.status == 413
                                   ? "Payload Too Large"
                                   : "HTTP " + std::to_string(response.status);
        response.set_content(
            serialise(rpcError(nullptr, kInvalidRequest, message)),
            "application/json");
      });
}

} // namespace

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
