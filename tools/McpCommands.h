//===- McpCommands.h - the commands behind the MCP tools --------*- C++ -*-===//
#ifndef ADAPT_TOOLS_MCPCOMMANDS_H
#define ADAPT_TOOLS_MCPCOMMANDS_H

#include "agent/mcp/McpRegistry.h"

namespace adapt {

/// The commands `adapt serve`'s tools call in-process: each fills its
/// command's options from the tool's arguments, the way the command's flags
/// would, and calls the same function the command line does
/// (inspectModel, writeGaps, buildTrainer, validateModel, generateCandidates).
mcp::AdaptCommands adaptCommandsForMcp();

} // namespace adapt

#endif // ADAPT_TOOLS_MCPCOMMANDS_H
