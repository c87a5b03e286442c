//===- McpProtocol.h - JSON-RPC and JSON-schema helpers ---------*- C++ -*-===//
//
// What the MCP server (McpServer.cpp) needs of JSON beyond the tool results
// McpRegistry.h declares (toolError, toolStructured, inputRequired,
// inputResponse, defined in McpProtocol.cpp too): JSON-RPC messages, field
// readers that never throw on a client's wrong type, the argument check
// against a tool's input schema, URI templates and bounded parsing.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_AGENT_MCP_MCPPROTOCOL_H
#define ADAPT_AGENT_MCP_MCPPROTOCOL_H

#include "agent/mcp/McpRegistry.h"

#include <cstddef>
#include <map>
#include <string>

namespace adapt::mcp {

/// OBJECT[KEY] when OBJECT is an object and the field a string, else "".
std::string stringField(const json &object, const char *key);

/// OBJECT[KEY] when it is an integer that fits an int, else \p fallback.
int integerField(const json &object, const char *key, int fallback);

/// A JSON-RPC error response (\p data left out when null).
json rpcError(const json &id, int code, const std::string &message, const json &data = nullptr);

/// A JSON-RPC result response.
json rpcResult(const json &id, const json &result);

/// \p message as one line of JSON; invalid UTF-8 is replaced, never thrown.
std::string serialise(const json &message);

/// \p bytes random bytes as lowercase hex (session and task ids).
std::string randomHex(size_t bytes);

/// Whether \p value has the JSON-schema \p type (a name or a list of names).
bool matchesType(const json &value, const json &type);

/// Checks \p arguments against a tool's input \p schema (required keys,
/// top-level types, enums, additionalProperties: false); a message or "".
std::string checkArguments(const json &schema, const json &arguments);

/// Matches \p uri against a template like test://template/{id}/data,
/// filling \p variables.
bool matchTemplate(const std::string &pattern, const std::string &uri,
                   std::map<std::string, std::string> &variables);

/// Parses \p text, refusing nesting deeper than 128 (copying and printing
/// JSON recurse; a million nested objects would overflow the stack).
json parseBounded(const std::string &text);

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPPROTOCOL_H
