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

bool parseNumber(const std::string &text, long long low, long long high,
                 long long &into) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos ||
      text.size() > 12)
    return false;
  into = std::stoll(text);
  return into >= low && into <= high;
}

int usageError(const std::string &message) {
  std::cerr << "adapt: error: " << message << "\nusage:\n" << kServeUsage;
  return 2;
}

} // namespace

int runServeCommand(int argc, char **argv) {
  mcp::ServeOptions options;
  bool testMode = false;
  std::vector<std::string> roots, readRoots;
  if (const char *token = std::getenv("ADAPT_MCP_TOKEN"))
    options.bearerToken = token;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string &into) { return takeFlagValue(argc, argv, i, into); };
    std::string text;
    long long number = 0;
    if (arg == "--port") {
      if (!value(text) || !parseNumber(text, 0, 65535, number))
        return usageError("--port expects an integer in 0..65535");
      options.port = static_cast<int>(number);
    } else if (arg == "--host") {
      if (!value(options.host) || options.host.empty())
        return usageError("--host expects an address");
    } else if (arg == "--token") {
      if (!value(options.bearerToken) || options.bearerToken.empty())
        return usageError("--token expects a value");
    } else if (arg == "--allow-host") {
      if (!value(text) || text.empty())
        return usageError("--allow-host expects a host name");
      options.allowedHosts.push_back(text);
    } else if (arg == "--max-body") {
      if (!value(text) || !parseNumber(text, 1024, 1LL << 32, number))
        return usageError("--max-body expects a byte count in 1024..4294967296");
      options.maxBodyBytes = static_cast<size_t>(number);
    } else if (arg == "--root" || arg == "--read-root") {
      if (!value(text) || text.empty())
        return usageError(arg + " expects a folder");
      (arg == "--root" ? roots : readRoots).push_back(text);
    } else if (arg == "--max-connections") {
      if (!value(text) || !parseNumber(text, 1, 4096, number))
        return usageError("--max-connections expects an integer in 1..4096");
      options.limits.maxConnections = static_cast<int>(number);
    } else if (arg == "--request-timeout") {
      if (!value(text) || !parseNumber(text, 1, 3600, number))
        return usageError("--request-timeout expects seconds in 1..3600");
      options.limits.requestTimeout = std::chrono::seconds(number);
    } else if (arg == "--test-mode") {
      testMode = true;
    } else {
      return usageError("unknown argument " + arg);
    }
  }
  const bool loopback = options.host == "127.0.0.1" || options.host == "localhost" ||
                        options.host == "::1";
  // The Host check stops DNS rebinding, not other users or machines: any
  // address but loopback serves only with a bearer token.
  if (!loopback && options.bearerToken.empty())
    return usageError("--host " + options.host +
                      " is reachable from other machines: give --token (or ADAPT_MCP_TOKEN)");
  if (!loopback)
    options.allowedHosts.push_back(options.host);
  // Tools reach only these folders; by default the working folder.
  if (roots.empty())
    roots.push_back(".");
  std::string error;
  std::optional<mcp::Workspace> workspace = mcp::Workspace::create(roots, readRoots, error);
  if (!workspace)
    return usageError(error);
  // Every connection gets a worker, so the cap must leave workers free.
  options.threads = std::max(options.threads, options.limits.maxConnections + 8);
  mcp::Registry registry;
  mcp::addAdaptTools(registry, adaptExecutable(), *workspace);
  if (testMode)
    mcp::addConformanceFixtures(registry);
  return mcp::serve(options, registry);
}

} // namespace adapt
