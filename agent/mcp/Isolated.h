//===- Isolated.h - run a command in-process, in a forked child -*- C++ -*-===//
//
// The MCP tools call the adapt commands as functions, in-process: no binary
// is re-run and no command line is assembled. Each call still runs in a child
// forked for it, so a crash or runaway allocation in a command ends that call
// only, and a client's cancel can stop it (and whatever it started: cmake, a
// trainer) at once. The server process itself never runs a command, so the
// child starts from a parent that holds no compiler state or locks of its own.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_ISOLATED_H
#define ADAPT_AGENT_MCP_ISOLATED_H

#include "agent/mcp/McpRegistry.h"

#include <functional>
#include <string>

namespace adapt::mcp {

/// What a finished call left behind: the exit code (128 + N when signal N
/// ended it) and the tail of what it printed.
struct IsolatedResult {
  int exitCode = -1;
  std::string stdoutText, stderrText;
  bool cancelled = false;
};

/// Keeps at most this much of each stream (the tail), so a chatty build
/// cannot exhaust the server's memory.
constexpr size_t kMaxIsolatedOutput = 256 * 1024;

/// Runs \p body (which returns an exit code and prints to stdout/stderr) in a
/// forked child with its own process group, stdin from /dev/null and no
/// descriptor of the server's. Reports a heartbeat through \p context every
/// second, labelled \p label; when the client cancels, the child's whole
/// process group gets SIGTERM. An exception escaping \p body ends the child as
/// a crash does (std::terminate: SIGABRT, its what() on stderr); the adapt
/// tools' commands report theirs as the command line does
/// (tools/McpCommands.cpp). Throws std::runtime_error when no child can be
/// started.
IsolatedResult runIsolated(const std::function<int()> &body, CallContext &context,
                           const std::string &label);

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_ISOLATED_H
