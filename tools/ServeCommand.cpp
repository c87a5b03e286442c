//===- ServeCommand.cpp - `adapt serve` -----------------------------------===//
//
// Parses the flags and starts the MCP server (agent/mcp). The bearer token
// may also come from ADAPT_MCP_TOKEN, so it need not appear in `ps`. Tool
// paths are confined to --root (writable) and --read-root folders.
//
//===----------------------------------------------------------------------===//

#include "tools/ServeCommand.h"
#include "tools/CommandLine.h"
#include "agent/mcp/McpServer.h"
#include "tools/McpCommands.h"

#include "llvm/Support/CommandLine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <optional>
#include <vector>
#include <cstdlib>
#include <iostream>
#include <string>
#include <unistd.h>

namespace adapt {

const char *const kServeUsage =
    "  adapt serve [--port N] [--host ADDR] [--token TOKEN] [--allow-host NAME]\n"
    "              [--root DIR]... [--read-root DIR]... [--max-body BYTES]\n"
    "              [--max-connections N] [--request-timeout SECONDS] [--test-mode]\n";

namespace {

cl::SubCommand serveCommand("serve", "Serve adapt's tools over the Model Context Protocol");
cl::opt<int> port("port", cl::sub(serveCommand), cl::init(0),
                  cl::desc("0..65535; 0 takes any free port"));
cl::opt<std::string> host("host", cl::sub(serveCommand), cl::init("127.0.0.1"),
                          cl::desc("address to listen on"));
cl::opt<std::string> token("token", cl::sub(serveCommand),
                           cl::desc("bearer token clients must send"));
cl::list<std::string> allowHosts("allow-host", cl::sub(serveCommand),
                                 cl::desc("a Host header name to accept"));
cl::list<std::string> roots("root", cl::sub(serveCommand),
                            cl::desc("a folder tools may read and write"));
cl::list<std::string> readRoots("read-root", cl::sub(serveCommand),
                                cl::desc("a folder tools may only read"));
cl::opt<uint64_t> maxBody("max-body", cl::sub(serveCommand),
                          cl::desc("request body limit in bytes, 1024..4294967296"));
cl::opt<int> maxConnections("max-connections", cl::sub(serveCommand),
                            cl::desc("open connections, 1..4096"));
cl::opt<int> requestTimeout("request-timeout", cl::sub(serveCommand),
                            cl::desc("seconds to receive a request, 1..3600"));
cl::opt<bool> testMode("test-mode", cl::sub(serveCommand),
                       cl::desc("also serve the conformance suite's fixtures"));

int usage(const std::string &message) { return usageError(message, kServeUsage); }

/// An empty value among \p values, the flag's usage error; 0 when none.
int emptyValueError(const cl::list<std::string> &values, const std::string &flag,
                    const char *expected) {
  for (const std::string &value : values)
    if (value.empty())
      return usage(flag + " expects " + expected);
  return 0;
}

} // namespace

int runServeCommand() {
  mcp::ServeOptions options;
  if (const char *fromEnvironment = std::getenv("ADAPT_MCP_TOKEN"))
    options.bearerToken = fromEnvironment;
  if (std::string range = rangeError("--port", port, 0, 65535); !range.empty())
    return usage(range);
  options.port = port;
  if (host.empty())
    return usage("--host expects an address");
  options.host = host;
  if (token.getNumOccurrences()) {
    if (token.empty())
      return usage("--token expects a value");
    options.bearerToken = token;
  }
  if (int rc = emptyValueError(allowHosts, "--allow-host", "a host name"))
    return rc;
  options.allowedHosts.assign(allowHosts.begin(), allowHosts.end());
  if (maxBody.getNumOccurrences()) {
    if (std::string range = rangeError("--max-body", int64_t(std::min<uint64_t>(maxBody, INT64_MAX)), 1024,
                                       int64_t(1) << 32);
        !range.empty())
      return usage(range);
    options.maxBodyBytes = static_cast<size_t>(maxBody);
  }
  if (int rc = emptyValueError(roots, "--root", "a folder"))
    return rc;
  if (int rc = emptyValueError(readRoots, "--read-root", "a folder"))
    return rc;
  if (maxConnections.getNumOccurrences()) {
    if (std::string range = rangeError("--max-connections", maxConnections, 1, 4096); !range.empty())
      return usage(range);
    options.limits.maxConnections = maxConnections;
  }
  if (requestTimeout.getNumOccurrences()) {
    if (std::string range = rangeError("--request-timeout", requestTimeout, 1, 3600); !range.empty())
      return usage(range);
    options.limits.requestTimeout = std::chrono::seconds(requestTimeout);
  }
  const bool loopback = options.host == "127.0.0.1" || options.host == "localhost" ||
                        options.host == "::1";
  // The Host check stops DNS rebinding, not other users or machines: any
  // address but loopback serves only with a bearer token.
  if (!loopback && options.bearerToken.empty())
    return usage("--host " + options.host +
                      " is reachable from other machines: give --token (or ADAPT_MCP_TOKEN)");
  if (!loopback)
    options.allowedHosts.push_back(options.host);
  // Tools reach only these folders; by default the working folder.
  std::vector<std::string> writable(roots.begin(), roots.end());
  if (writable.empty())
    writable.push_back(".");
  std::string error;
  std::optional<mcp::Workspace> workspace = mcp::Workspace::create(
      writable, std::vector<std::string>(readRoots.begin(), readRoots.end()), error);
  if (!workspace)
    return usage(error);
  // Every connection gets a worker, so the cap must leave workers free.
  options.threads = std::max(options.threads, options.limits.maxConnections + 8);
  mcp::Registry registry;
  mcp::addAdaptTools(registry, adaptCommandsForMcp(), *workspace);
  if (testMode)
    mcp::addConformanceFixtures(registry);
  return mcp::serve(options, registry);
}

} // namespace adapt
