//===- ServeCommand.h - `adapt serve` ---------------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_SERVECOMMAND_H
#define ADAPT_TOOLS_SERVECOMMAND_H

namespace adapt {

/// Usage lines of `adapt serve`, for the CLI's help text.
extern const char *const kServeUsage;

/// `adapt serve [--port N] [--host H] [--token T] [--allow-host H]
/// [--max-body BYTES] [--test-mode]`: an MCP server on http://H:N/mcp until
/// SIGINT/SIGTERM. Returns 0 after a clean stop, 2 on bad usage or when the
/// port cannot be bound.
int runServeCommand();

} // namespace adapt

#endif // ADAPT_TOOLS_SERVECOMMAND_H
