//===- FuzzJsonRpc.cpp - libFuzzer target for `adapt serve`'s POST /mcp ---===//
//
// Feeds arbitrary bytes to the MCP server's JSON-RPC request handling. The
// first two bytes choose headers (session, MCP-Protocol-Version, Mcp-Method /
// Mcp-Name / Mcp-Param-Region mirrored from the body, Accept, Origin, Host,
// bearer token); the rest is the POST body. Each input gets a fresh server
// over the conformance fixtures (no adapt tools: they spawn processes) and
// goes through the access check and handlePost as httplib would route it; an
// SSE answer is drained through a capturing sink that answers the server's
// own requests (sampling, elicitation) at once. Aborts unless every answer is
// one a client can rely on: an expected HTTP status, JSON bodies that are
// JSON-RPC 2.0 messages, the reply's id echoing the request's.
//
// This file includes McpServer.cpp itself (a unity build: the McpServer
// class is private to agent/mcp, McpServerImpl.h) and must not be linked
// with it; McpTransport.cpp (handlePost, checkAccess) is linked.
//
// Build: tests/fuzz/run_fuzzers.sh (clang++-19 -fsanitize=fuzzer,address,
//        undefined with McpTransport.cpp, McpProtocol.cpp, McpTasks.cpp,
//        McpParamHeaders.cpp, ConnectionGuard.cpp and McpFixtures*.cpp)
//
//===----------------------------------------------------------------------===//
#include "agent/mcp/McpServer.cpp"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

namespace adapt::mcp {
namespace {

/// handlePost and checkAccess are private. An explicit instantiation may name
/// private members ([temp.spec]), so Expose hands their pointers to a friend
/// function without editing McpServer.cpp.
template <typename Tag, typename Tag::type Pointer> struct Expose {
  friend typename Tag::type member(Tag) { return Pointer; }
};
struct PostTag {
  using type = void (McpServer::*)(const httplib::Request &, httplib::Response &);
  friend type member(PostTag);
};
struct AccessTag {
  using type = bool (McpServer::*)(const httplib::Request &, httplib::Response &);
  friend type member(AccessTag);
};
template struct Expose<PostTag, &McpServer::handlePost>;
template struct Expose<AccessTag, &McpServer::checkAccess>;

/// Flag bits of the input's first byte.
enum : unsigned {
  kSession = 1,       ///< initialize first, then send its Mcp-Session-Id
  kVersionMask = 6,   ///< MCP-Protocol-Version: none, stateful, stateless, bogus
  kRouting = 8,       ///< Mcp-Method / Mcp-Name mirrored from the body
  kJsonOnly = 16,     ///< Accept: application/json only (no SSE)
  kParamHeader = 32,  ///< Mcp-Param-Region mirrored from arguments.region
  kCapabilities = 64, ///< initialize declares sampling, elicitation, roots, tasks
  kErrorReplies = 128 ///< answer the server's requests with JSON-RPC errors
};
/// Flag bits of the second byte.
enum : unsigned {
  kStaleSession = 1,   ///< Mcp-Session-Id of a session that does not exist
  kWrongType = 2,      ///< Content-Type: text/plain
  kForeignOrigin = 4,  ///< Origin: http://evil.example
  kNeedToken = 8,      ///< the server requires a bearer token
  kSendToken = 16,     ///< the request carries it
  kForeignHost = 32,   ///< Host: evil.example
};

/// FUZZ_JSONRPC_VERBOSE=1 prints every answer (to read a reproducer).
const bool verbose = std::getenv("FUZZ_JSONRPC_VERBOSE") != nullptr;

[[noreturn]] void fail(const char *what, const std::string &detail) {
  std::fprintf(stderr, "FuzzJsonRpc: %s: %s\n", what, detail.c_str());
  std::abort();
}

/// The conformance fixtures, with the handlers that sleep (up to 20 s, or as
/// long as the arguments say) replaced by ones that make the same context
/// calls at once: -timeout=5 must only ever catch a real hang.
const Registry &fixtures() {
  static const Registry registry = [] {
    Registry r;
    addConformanceFixtures(r);
    auto replace = [&r](const char *name, decltype(ToolDef::handler) handler) {
      for (ToolDef &tool : r.tools)
        if (tool.name == name) {
          tool.handler = std::move(handler);
          return;
        }
      fail("fixture renamed", name); // a new sleeping fixture needs a stub
    };
    auto text = [](const std::string &value) {
      return json{{"content", json::array({{{"type", "text"}, {"text", value}}})}};
    };
    auto progress = [text](const json &, CallContext &context) {
      for (int step : {0, 50, 100})
        context.progress(step, 100.0, "step " + std::to_string(step));
      return text(context.requestMeta().value("progressToken", json(0)).dump());
    };
    replace("test_tool_with_logging", [text](const json &, CallContext &context) {
      for (const char *message : {"started", "working", "completed"})
        context.log("info", message);
      return text("logged");
    });
    replace("test_tool_with_progress", progress);
    replace("adapt_test_wait_for_cancel", progress);
    replace("slow_compute", [text](const json &arguments, CallContext &context) {
      return text("slow_compute " + arguments.value("label", "") +
                  (context.cancelled() ? " cancelled" : " done"));
    });
    replace("failing_job", [](const json &, CallContext &) -> json {
      throw std::runtime_error("failing_job failed on purpose");
    });
    return r;
  }();
  return registry;
}

/// Aborts unless MESSAGE is a JSON-RPC 2.0 message a client can read.
void checkMessage(const json &message) {
  if (!message.is_object() || message.value("jsonrpc", json()) != "2.0")
    fail("not a JSON-RPC 2.0 object", serialise(message));
  if (message.contains("id") && !message["id"].is_null() &&
      !message["id"].is_string() && !message["id"].is_number_integer())
    fail("bad id", serialise(message));
  if (message.contains("method")) { // a notification or a server request
    if (!message["method"].is_string())
      fail("method not a string", serialise(message));
    return;
  }
  if (!message.contains("id") ||
      message.contains("result") == message.contains("error"))
    fail("neither one result nor one error", serialise(message));
  if (message.contains("error")) {
    const json &error = message["error"];
    if (!error.is_object() || !error.contains("code") ||
        !error["code"].is_number_integer() || !error.contains("message") ||
        !error["message"].is_string())
      fail("malformed error", serialise(message));
  }
}

/// A POST /mcp as a local client sends it.
httplib::Request basePost(const std::string &body) {
  httplib::Request request;
  request.method = "POST";
  request.path = "/mcp";
  request.set_header("Host", "127.0.0.1:8080");
  request.set_header("Content-Type", "application/json");
  request.set_header("Accept", "application/json, text/event-stream");
  request.body = body;
  return request;
}

/// FUZZ_JSONRPC_ALLOW_500=1 answers an exception escaping handlePost the way
/// httplib does (HTTP 500, no JSON-RPC body) and goes on, printing each
/// distinct message once: to fuzz past a known bug. By default it escapes
/// and terminates, so the crash stack shows where it was thrown.
const bool allow500 = std::getenv("FUZZ_JSONRPC_ALLOW_500") != nullptr;

void post(McpServer &server, const httplib::Request &request,
          httplib::Response &response) {
  if (!allow500) {
    if ((server.*member(AccessTag{}))(request, response))
      (server.*member(PostTag{}))(request, response);
    return;
  }
  try {
    if ((server.*member(AccessTag{}))(request, response))
      (server.*member(PostTag{}))(request, response);
  } catch (const std::exception &error) {
    static std::set<std::string> seen;
    if (seen.insert(error.what()).second)
      std::fprintf(stderr, "FuzzJsonRpc: HTTP 500 (allowed): %s\n", error.what());
    response = httplib::Response();
    response.status = 500;
  }
}

/// Drains an SSE answer: every event must be a JSON-RPC message, the
/// server's requests are answered on SESSIONID at once (so requestClient
/// never waits), and the last message must be the reply to REQUESTID.
void drainStream(McpServer &server, httplib::Response &response,
                 const std::string &sessionId, const json &requestId,
                 bool errorReplies) {
  httplib::DataSink sink;
  bool done = false;
  json last;
  sink.is_writable = [] { return true; };
  sink.done = [&done] { done = true; };
  sink.write = [&](const char *data, size_t size) {
    std::string event(data, size);
    if (verbose)
      std::fprintf(stderr, "SSE %s", event.c_str());
    size_t at = event.find("\ndata: ");
    if (event.rfind("id: ", 0) != 0 || at == std::string::npos ||
        event.size() < 2 || event.compare(event.size() - 2, 2, "\n\n") != 0)
      fail("malformed SSE event", event);
    std::string payload = event.substr(at + 7, event.size() - at - 9);
    json message = json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (message.is_discarded())
      fail("SSE data is not JSON", payload);
    checkMessage(message);
    last = message;
    if (message.contains("method") && message.contains("id")) {
      json reply = {{"jsonrpc", "2.0"}, {"id", message["id"]}};
      if (errorReplies)
        reply["error"] = {{"code", -1}, {"message", "declined"}};
      else if (message["method"] == "sampling/createMessage")
        reply["result"] = {{"role", "assistant"},
                           {"content", {{"type", "text"}, {"text", "Paris"}}},
                           {"model", "fuzz"}};
      else
        reply["result"] = {{"action", "accept"},
                           {"content", {{"name", "fuzz"}, {"confirmed", true}}},
                           {"roots", json::array()}};
      httplib::Request answer = basePost(serialise(reply));
      answer.set_header("Mcp-Session-Id", sessionId);
      httplib::Response accepted;
      post(server, answer, accepted);
      if (accepted.status != 202)
        fail("reply to the server not accepted", accepted.body);
    }
    return true;
  };
  if (!response.content_provider_(0, 0, sink) || !done)
    fail("SSE stream not finished", "");
  if (!last.is_object() || last.contains("method") ||
      last.value("id", json()) != requestId)
    fail("SSE stream does not end with the reply", serialise(last));
}

} // namespace
} // namespace adapt::mcp

/// libFuzzer entry point: two flag bytes, then one POST body.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace adapt::mcp;
  if (size < 2)
    return 0;
  unsigned flags = data[0], extra = data[1];
  std::string body(reinterpret_cast<const char *>(data) + 2, size - 2);

  ServeOptions options;
  if (extra & kNeedToken)
    options.bearerToken = "fuzz-token";
  McpServer server(options, fixtures());

  std::string sessionId;
  if (flags & kSession) {
    json capabilities = json::object();
    if (flags & kCapabilities)
      capabilities = {{"sampling", json::object()},
                      {"elicitation", json::object()},
                      {"roots", json::object()},
                      {"extensions", {{kTasksExtension, json::object()}}}};
    httplib::Request init = basePost(serialise(
        {{"jsonrpc", "2.0"},
         {"id", 0},
         {"method", "initialize"},
         {"params", {{"protocolVersion", kLatestStateful},
                     {"capabilities", capabilities},
                     {"clientInfo", {{"name", "fuzz"}, {"version", "0"}}}}}}));
    httplib::Response response;
    (server.*member(PostTag{}))(init, response);
    sessionId = response.get_header_value("Mcp-Session-Id");
    if (response.status != 200 || sessionId.empty())
      fail("initialize failed", response.body);
  } else if (extra & kStaleSession) {
    sessionId = "0123456789abcdef0123456789abcdef";
  }

  httplib::Request request = basePost(body);
  if (!sessionId.empty())
    request.set_header("Mcp-Session-Id", sessionId);
  static const char *const versions[] = {nullptr, kLatestStateful, kStateless,
                                         "1999-01-01"};
  if (const char *version = versions[(flags & kVersionMask) >> 1])
    request.set_header("MCP-Protocol-Version", version);
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  const json params = parsed.is_object() && parsed.contains("params") &&
                              parsed["params"].is_object()
                          ? parsed["params"]
                          : json::object();
  if ((flags & kRouting) && parsed.is_object()) {
    if (parsed.contains("method") && parsed["method"].is_string())
      request.set_header("Mcp-Method", parsed["method"].get<std::string>());
    for (const char *key : {"name", "uri", "taskId"})
      if (params.contains(key) && params[key].is_string()) {
        request.set_header("Mcp-Name", params[key].get<std::string>());
        break;
      }
  }
  if (flags & kParamHeader) {
    json arguments = params.value("arguments", json::object());
    request.set_header("Mcp-Param-Region",
                       arguments.is_object() && arguments.contains("region") &&
                               arguments["region"].is_string()
                           ? arguments["region"].get<std::string>()
                           : "eu");
  }
  auto replaceHeader = [&request](const char *name, const char *value) {
    request.headers.erase(name);
    request.set_header(name, value);
  };
  if (flags & kJsonOnly)
    replaceHeader("Accept", "application/json");
  if (extra & kWrongType)
    replaceHeader("Content-Type", "text/plain");
  if (extra & kForeignOrigin)
    request.set_header("Origin", "http://evil.example");
  if (extra & kSendToken)
    request.set_header("Authorization", "Bearer fuzz-token");
  if (extra & kForeignHost)
    replaceHeader("Host", "evil.example");

  httplib::Response response;
  post(server, request, response);

  if (verbose)
    std::fprintf(stderr, "HTTP %d %s\n", response.status, response.body.c_str());
  // What a client relies on.
  if (response.content_provider_) { // an SSE answer to a tools/call
    if (response.get_header_value("Content-Type") != "text/event-stream" ||
        !parsed.is_object() || parsed.value("method", json()) != "tools/call")
      fail("unexpected stream", body);
    drainStream(server, response, sessionId, parsed["id"],
                flags & kErrorReplies);
    return 0;
  }
  int status = response.status;
  if (status == 500 && allow500)
    return 0;
  if (status != 200 && status != 202 && status != 400 && status != 401 &&
      status != 403 && status != 404 && status != 415)
    fail("unexpected HTTP status", std::to_string(status));
  if (status == 202) {
    if (!response.body.empty())
      fail("202 with a body", response.body);
    return 0;
  }
  if (response.get_header_value("Content-Type") != "application/json")
    fail("answer is not application/json", response.body);
  json reply = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded())
    fail("answer is not JSON", response.body);
  checkMessage(reply);
  if (reply.contains("method"))
    fail("answer is not a reply", response.body);
  if (status != 200 && !reply.contains("error"))
    fail("HTTP error without a JSON-RPC error", response.body);
  if (status == 200 && parsed.is_object() && parsed.contains("id") &&
      reply["id"] != parsed["id"])
    fail("reply id differs from the request's", response.body);
  if (status == 200 && (flags & kSession) &&
      response.get_header_value("Mcp-Session-Id") != sessionId)
    fail("session answer without its Mcp-Session-Id", response.body);
  return 0;
}
