//===- McpParamHeaders.cpp - Mcp-Param-* request headers ------------------===//

#include "agent/mcp/McpParamHeaders.h"

namespace adapt::mcp {
namespace {

/// The value of one base64 digit, or -1.
int base64Digit(char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

/// Strict base64 (RFC 4648 with padding); nullopt when malformed.
std::optional<std::string> decodeBase64(const std::string &text) {
  if (text.size() % 4 != 0)
    return std::nullopt;
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    int values[4];
    int padding = 0;
    for (int j = 0; j < 4; ++j) {
      char c = text[i + j];
      if (c == '=') {
        // Padding only in the last group's last one or two places.
        if (i + 4 != text.size() || j < 2)
          return std::nullopt;
        ++padding;
        values[j] = 0;
        continue;
      }
      if (padding > 0 || (values[j] = base64Digit(c)) < 0)
        return std::nullopt;
    }
    unsigned bits = (values[0] << 18) | (values[1] << 12) | (values[2] << 6) |
                    values[3];
    out += static_cast<char>((bits >> 16) & 0xff);
    if (padding < 2)
      out += static_cast<char>((bits >> 8) & 0xff);
    if (padding < 1)
      out += static_cast<char>(bits & 0xff);
  }
  return out;
}

std::string trim(const std::string &text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos)
    return "";
  size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

} // namespace

std::optional<std::string> decodeParamHeader(const std::string &raw) {
  std::string value = trim(raw);
  const std::string prefix = "=?base64?", suffix = "?=";
  if (value.size() >= prefix.size() + suffix.size() &&
      value.compare(0, prefix.size(), prefix) == 0 &&
      value.compare(value.size() - suffix.size(), suffix.size(), suffix) == 0)
    return decodeBase64(value.substr(
        prefix.size(), value.size() - prefix.size() - suffix.size()));
  return value;
}

std::string checkParamHeaders(
    const nlohmann::json &inputSchema, const nlohmann::json &arguments,
    const std::function<std::optional<std::string>(const std::string &)>
        &header) {
  if (!inputSchema.is_object() || !inputSchema.contains("properties") ||
      !inputSchema["properties"].is_object() || !arguments.is_object())
    return "";
  const nlohmann::json &properties = inputSchema["properties"];
  for (auto it = properties.begin(); it != properties.end(); ++it) {
    if (!it->is_object() || !it->contains("x-mcp-header") ||
        !(*it)["x-mcp-header"].is_string())
      continue;
    std::string name = "Mcp-Param-" + (*it)["x-mcp-header"].get<std::string>();
    if (!arguments.contains(it.key()) || arguments[it.key()].is_null())
      continue;
    const nlohmann::json &argument = arguments[it.key()];
    std::string expected = argument.is_string() ? argument.get<std::string>()
                                                : argument.dump();
    std::optional<std::string> raw = header(name);
    if (!raw)
      return name + " header is required (argument \"" + it.key() +
             "\" is present)";
    std::optional<std::string> value = decodeParamHeader(*raw);
    if (!value)
      return name + " header is not valid base64";
    if (*value != expected)
      return name + " header does not match argument \"" + it.key() + "\"";
  }
  return "";
}

} // namespace adapt::mcp
