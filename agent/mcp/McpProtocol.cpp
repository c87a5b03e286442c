//===- McpProtocol.cpp - JSON-RPC and JSON-schema helpers of the MCP server ===//
//
// Pure functions over nlohmann::json: the shapes of tool results and JSON-RPC
// messages, tolerant field readers (a client's wrong type is a protocol error,
// never an exception), the tools' argument check against their input schemas,
// URI templates and a parser with bounded nesting. No transport, no state.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpProtocol.h"

#include <cmath>
#include <climits>
#include <random>
#include <stdexcept>

namespace adapt::mcp {

json toolError(const std::string &message) {
  return json{{"content", json::array({{{"type", "text"}, {"text", message}}})},
              {"isError", true}};
}

json inputRequired(const json &inputRequests, const std::string &state) {
  json result = {{"resultType", "input_required"},
                 {"inputRequests", inputRequests}};
  if (!state.empty())
    result["requestState"] = state;
  return result;
}

json inputResponse(const json &params, const std::string &key) {
  if (!params.contains("inputResponses") ||
      !params["inputResponses"].is_object())
    return nullptr;
  const json &responses = params["inputResponses"];
  if (!responses.contains(key) || !responses[key].is_object())
    return nullptr;
  return responses[key];
}

json toolStructured(const json &structured, bool isError) {
  json result = {
      {"content", json::array({{{"type", "text"},
                                {"text", structured.dump(2, ' ', false,
                                                         json::error_handler_t::replace)}}})},
      {"structuredContent", structured}};
  if (isError)
    result["isError"] = true;
  return result;
}

/// OBJECT[KEY] when OBJECT is an object and the field a string, else "":
/// a client's wrong type is a protocol error further on, never an exception
/// (nlohmann's value() throws on a type mismatch; tests/fuzz/FuzzJsonRpc.cpp).
std::string stringField(const json &object, const char *key) {
  if (!object.is_object())
    return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

/// OBJECT[KEY] when it is an integer that fits an int, else FALLBACK.
int integerField(const json &object, const char *key, int fallback) {
  if (!object.is_object())
    return fallback;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer())
    return fallback;
  int64_t value = it->get<int64_t>();
  return value >= INT32_MIN && value <= INT32_MAX ? static_cast<int>(value) : fallback;
}

json rpcError(const json &id, int code, const std::string &message, const json &data) {
  json error = {{"code", code}, {"message", message}};
  if (!data.is_null())
    error["data"] = data;
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"error", error}};
}

json rpcResult(const json &id, const json &result) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"result", result}};
}

/// MESSAGE as one line of JSON; invalid UTF-8 (echoed from a bad request or
/// a tool's output) is replaced, never thrown.
std::string serialise(const json &message) {
  return message.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string randomHex(size_t bytes) {
  static thread_local std::mt19937_64 engine{std::random_device{}()};
  static const char *digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    unsigned value = engine() & 0xff;
    out += digits[value >> 4];
    out += digits[value & 15];
  }
  return out;
}

/// A type check of one argument against a JSON schema "type".
bool matchesType(const json &value, const json &type) {
  if (type.is_array()) {
    for (const json &one : type)
      if (matchesType(value, one))
        return true;
    return false;
  }
  if (!type.is_string())
    return true;
  std::string name = type;
  if (name == "string")
    return value.is_string();
  if (name == "integer")
    return value.is_number_integer() ||
           (value.is_number_float() &&
            value.get<double>() == static_cast<long long>(value.get<double>()));
  if (name == "number")
    return value.is_number();
  if (name == "boolean")
    return value.is_boolean();
  if (name == "object")
    return value.is_object();
  if (name == "array")
    return value.is_array();
  if (name == "null")
    return value.is_null();
  return true;
}

/// Checks one argument KEY = VALUE against its PROPERTY's bounds ("minimum",
/// "maximum", "exclusiveMinimum" for numbers; "minItems" and the items'
/// "type" for arrays), so a command never sees a number it cannot hold or a
/// list of the wrong things; returns a message or "".
static std::string checkBounds(const std::string &key, const json &value, const json &property) {
  auto bound = [&](const char *name) {
    return property.contains(name) && property[name].is_number() ? property[name].get<double>()
                                                                   : std::nan("");
  };
  if (value.is_number()) {
    const double number = value.get<double>(), minimum = bound("minimum"),
                 maximum = bound("maximum"), above = bound("exclusiveMinimum");
    if (!std::isfinite(number) || number < minimum || number > maximum || !(number > above || std::isnan(above)))
      return "argument \"" + key + "\" must be a number" +
             (std::isnan(minimum) ? "" : " >= " + property["minimum"].dump()) +
             (std::isnan(above) ? "" : " > " + property["exclusiveMinimum"].dump()) +
             (std::isnan(maximum) ? "" : (std::isnan(minimum) && std::isnan(above) ? " <= " : " and <= ") +
                                             property["maximum"].dump());
  }
  if (value.is_array()) {
    if (value.size() < bound("minItems"))
      return "argument \"" + key + "\" must have at least " + property["minItems"].dump() + " item(s)";
    if (property.contains("items") && property["items"].contains("type"))
      for (const json &item : value)
        if (!matchesType(item, property["items"]["type"]))
          return "argument \"" + key + "\" must hold items of type " + property["items"]["type"].dump();
  }
  return "";
}

/// Checks ARGUMENTS against a tool's input schema (required keys, top-level
/// types, bounds, enums, additionalProperties: false); returns a message or "".
std::string checkArguments(const json &schema, const json &arguments) {
  if (!arguments.is_object())
    return "arguments must be an object";
  if (schema.contains("required"))
    for (const json &key : schema["required"])
      if (key.is_string() && !arguments.contains(key.get<std::string>()))
        return "missing required argument \"" + key.get<std::string>() + "\"";
  json properties = schema.value("properties", json::object());
  for (auto it = arguments.begin(); it != arguments.end(); ++it) {
    if (!properties.contains(it.key())) {
      if (schema.value("additionalProperties", true) == false)
        return "unknown argument \"" + it.key() + "\"";
      continue;
    }
    const json &property = properties[it.key()];
    if (property.contains("type") && !matchesType(*it, property["type"]))
      return "argument \"" + it.key() + "\" must be of type " +
             property["type"].dump();
    if (std::string bound = checkBounds(it.key(), *it, property); !bound.empty())
      return bound;
    if (property.contains("enum") && property["enum"].is_array()) {
      bool found = false;
      for (const json &allowed : property["enum"])
        found = found || allowed == *it;
      if (!found)
        return "argument \"" + it.key() + "\" must be one of " +
               property["enum"].dump();
    }
  }
  return "";
}

/// Matches URI against a template like test://template/{id}/data.
bool matchTemplate(const std::string &pattern, const std::string &uri,
                   std::map<std::string, std::string> &variables) {
  size_t p = 0, u = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '{') {
      size_t close = pattern.find('}', p);
      if (close == std::string::npos)
        return false;
      std::string name = pattern.substr(p + 1, close - p - 1);
      char next = close + 1 < pattern.size() ? pattern[close + 1] : '\0';
      size_t end = next ? uri.find(next, u) : uri.size();
      if (end == std::string::npos || end == u)
        return false;
      variables[name] = uri.substr(u, end - u);
      u = end;
      p = close + 1;
    } else {
      if (u >= uri.size() || uri[u] != pattern[p])
        return false;
      ++u;
      ++p;
    }
  }
  return u == uri.size();
}

/// Deepest nesting a message may have: copying and printing JSON recurse,
/// so a body of a million nested objects would otherwise overflow the stack.
constexpr int kMaxNesting = 128;

/// Parses TEXT, refusing nesting deeper than kMaxNesting.
json parseBounded(const std::string &text) {
  return json::parse(text, [](int depth, json::parse_event_t, json &) {
    if (depth > kMaxNesting)
      throw std::runtime_error("nesting deeper than " +
                               std::to_string(kMaxNesting));
    return true;
  });
}

} // namespace adapt::mcp
