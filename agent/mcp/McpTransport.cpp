//===- McpTransport.cpp - the MCP server over HTTP -------------------------===//
//
// McpServer's HTTP half: the Host/Origin/token access check, sessions
// (found, forgotten when idle, deleted), the stateless envelope's checks,
// POST (JSON or an SSE stream for tools/call), the standalone GET stream and
// the routes httplib serves. The JSON-RPC dispatch is McpServer.cpp.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpServerImpl.h"

#include "agent/mcp/McpParamHeaders.h"

#include <sys/socket.h>

namespace adapt::mcp {

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
  std::shared_ptr<Session> session =
      sessionFor(request.get_header_value("Mcp-Session-Id"), response, nullptr, 405,
                 "Method Not Allowed: the standalone stream belongs to a session (2025-11-25); send Mcp-Session-Id");
  if (!session)
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
static std::string hostName(const std::string &host) {
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

std::shared_ptr<Session> McpServer::sessionFor(const std::string &id, httplib::Response &response,
                                               const json &requestId, int missingStatus,
                                               const std::string &missingMessage, bool take) {
  if (id.empty()) {
    if (missingStatus == 405) // RFC 9110: a 405 names the methods allowed.
      response.set_header("Allow", "POST, DELETE");
    sendJson(response, missingStatus, rpcError(requestId, kInvalidRequest, missingMessage));
    return nullptr;
  }
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(sessionsMutex);
    auto it = sessions.find(id);
    if (it != sessions.end()) {
      session = it->second;
      session->lastUsedSeconds = nowSeconds();
      if (take)
        sessions.erase(it);
    }
  }
  if (!session)
    sendJson(response, 404, rpcError(requestId, -32001, "Session not found"));
  return session;
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
  std::shared_ptr<Session> session = sessionFor(request.get_header_value("Mcp-Session-Id"), response, nullptr, 400,
                                                "Bad Request: Mcp-Session-Id required", /*take=*/true);
  if (!session)
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
static int checkStateless(const httplib::Request &request, const json &message,
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
  std::shared_ptr<Session> session =
      sessionFor(sessionId, response, id, 400, "Bad Request: Mcp-Session-Id required (send initialize first)");
  if (!session)
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

} // namespace adapt::mcp
