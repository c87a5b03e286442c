//===- McpParamHeaders.h - Mcp-Param-* request headers ----------*- C++ -*-===//
//
// SEP-2243: a tool argument whose schema says "x-mcp-header": "Name" is
// mirrored by stateless clients in an `Mcp-Param-Name` header, so that
// intermediaries can route on it. The server checks the two agree.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_MCPPARAMHEADERS_H
#define ADAPT_AGENT_MCP_MCPPARAMHEADERS_H

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>

namespace adapt::mcp {

/// Decodes a header value: surrounding whitespace dropped, and a value
/// wrapped as =?base64?...?= decoded (strict: padded, base64 alphabet only).
/// Returns nullopt for a malformed base64 value.
std::optional<std::string> decodeParamHeader(const std::string &raw);

/// Checks the Mcp-Param-* headers of a tools/call against ARGUMENTS, for the
/// tool with INPUTSCHEMA. HEADER returns a header's value, or nullopt when
/// absent. Returns "" when they agree, else what is wrong: an argument
/// present without its header, a malformed or different header value.
std::string checkParamHeaders(
    const nlohmann::json &inputSchema, const nlohmann::json &arguments,
    const std::function<std::optional<std::string>(const std::string &)>
        &header);

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPPARAMHEADERS_H
