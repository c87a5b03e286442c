//===- McpServer.h - MCP over Streamable HTTP -------------------*- C++ -*-===//
//
// A Model Context Protocol server on one endpoint (/mcp). It speaks both the
// 2025-11-25 revision (initialize, sessions, ping, GET/DELETE, cancellation)
// and the 2026-07-28 revision (stateless, server/discover, _meta on every
// request, Mcp-Method / Mcp-Name headers), answering with JSON or SSE.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_MCPSERVER_H
#define ADAPT_AGENT_MCP_MCPSERVER_H

#include "agent/mcp/ConnectionGuard.h"
#include "agent/mcp/McpRegistry.h"

#include <cstddef>
#include <string>
#include <vector>

namespace adapt::mcp {

/// How `adapt serve` listens and whom it lets in.
struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 0; ///< 0: any free port (printed on stdout)
  std::string bearerToken; ///< when set, every request needs it
  std::vector<std::string> allowedHosts; ///< extra Host/Origin names allowed
  size_t maxBodyBytes = 4 << 20; ///< larger POST bodies get HTTP 413
  int threads = 256; ///< worker threads (connections served at once)
  ConnectionLimits limits; ///< open connections, time to deliver a request
};

/// Serves REGISTRY until SIGINT/SIGTERM. Prints "listening on http://H:P/mcp"
/// on stdout once bound. Returns 0 after a clean shutdown, 2 if it could not
/// bind.
int serve(const ServeOptions &options, const Registry &registry);

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPSERVER_H
