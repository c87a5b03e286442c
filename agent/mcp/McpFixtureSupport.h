//===- McpFixtureSupport.h - pieces the conformance fixtures share -*- C++ -*-===//
//
// The fixtures of `adapt serve --test-mode` (McpFixtures.cpp,
// McpFixturesMultiRound.cpp, McpFixturesTasks.cpp) answer the MCP
// conformance suite. These are the content items and tool definitions all
// three write.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_MCPFIXTURESUPPORT_H
#define ADAPT_AGENT_MCP_MCPFIXTURESUPPORT_H

#include "agent/mcp/McpRegistry.h"

#include <functional>
#include <string>
#include <utility>

namespace adapt::mcp {

/// A text content item.
inline json text(const std::string &value) {
  return json{{"type", "text"}, {"text", value}};
}

/// A tool result whose content is the one text item \p value.
inline json textResult(const std::string &value) {
  return json{{"content", json::array({text(value)})}};
}

/// A fixture tool: a name, a description and its handler.
inline ToolDef simpleTool(const std::string &name, const std::string &description,
                          std::function<json(const json &, CallContext &)> handler) {
  ToolDef tool;
  tool.name = name;
  tool.description = description;
  tool.handler = std::move(handler);
  return tool;
}

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPFIXTURESUPPORT_H
