//===- McpServerImpl.h - the MCP server's private state ---------*- C++ -*-===//
//
// What McpServer.cpp (JSON-RPC dispatch: tools, resources, prompts, tasks)
// and McpTransport.cpp (HTTP: access checks, sessions, POST/GET/DELETE,
// SSE) share: protocol constants, a session, the emitter and request context
// of a tool call, and the McpServer class. A private header of agent/mcp.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_AGENT_MCP_MCPSERVERIMPL_H
#define ADAPT_AGENT_MCP_MCPSERVERIMPL_H

#include "agent/mcp/McpProtocol.h"
#include "agent/mcp/McpServer.h"
#include "agent/mcp/McpTasks.h"

#include <httplib.h>

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
inline int logLevelIndex(const std::string &level) {
  for (int i = 0; i < 8; ++i)
    if (level == kLogLevels[i])
      return i;
  return -1;
}

inline json serverInfo() {
  return json{{"name", "adapt"}, {"title", "adapt MoE LoRA toolchain"},
              {"version", "0.1.0"}};
}

/// Seconds on the steady clock.
inline int64_t nowSeconds() {
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
  /// The session \p id (a request's Mcp-Session-Id) names, its idle clock
  /// reset, or null after answering: \p missingStatus with \p missingMessage
  /// for JSON-RPC request \p requestId when \p id is empty, 404 (-32001)
  /// when the session is unknown or expired. \p take: removed (DELETE).
  std::shared_ptr<Session> sessionFor(const std::string &id, httplib::Response &response, const json &requestId,
                                      int missingStatus, const std::string &missingMessage, bool take = false);
  /// Drops sessions idle for kSessionIdleSeconds (clients that never DELETE).
  void forgetIdleSessions();
  void answer(const httplib::Request &request, httplib::Response &response,
              const json &message, std::shared_ptr<Session> session,
              bool stateless);
};

inline void sendJson(httplib::Response &response, int status, const json &body) {
  response.status = status;
  response.set_content(serialise(body), "application/json");
}

/// Sets \p key of the listing \p entry to \p value unless the value is
/// empty: optional fields (title, description, ...) are left out, not sent empty.
template <typename T>
inline void putUnlessEmpty(json &entry, const char *key, const T &value) {
  if (!value.empty())
    entry[key] = value;
}


} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPSERVERIMPL_H
