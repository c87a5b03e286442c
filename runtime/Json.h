//===- Json.h - the runtime's JSON value, read and written by nlohmann-json -*- C++ -*-===//
//
// The runtime reads safetensors headers, index files, JSONL datasets and its
// own checkpoint state, and writes adapter_config.json, metrics lines and
// records. JsonValue is the value those call sites use: object keys in file
// order, integers kept exact. Parsing and writing are nlohmann-json's
// (third_party/nlohmann, vendored because the runtime must build where only
// LibTorch exists); that header stays inside Json.cpp, so neither the other
// runtime files nor generated trainers compile it. The parser is strict RFC
// 8259 (no comments, no trailing commas, no NaN, valid UTF-8 and surrogate
// pairs, numbers within the double range) and also refuses duplicate keys
// and nesting past kMaxJsonDepth.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_JSON_H
#define ADAPT_RUNTIME_JSON_H

#include "runtime/Errors.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace adapt::rt {

class JsonValue;

/// Array elements in order.
using JsonArray = std::vector<JsonValue>;
/// Object members in the order they were parsed or added.
using JsonObject = std::vector<std::pair<std::string, JsonValue>>;

/// One JSON value. Integers without fraction or exponent that fit int64 are
/// kept exactly as Int; every other number is a Double.
class JsonValue {
public:
  enum class Kind { Null, Bool, Int, Double, String, Array, Object };

  JsonValue() = default;
  JsonValue(std::nullptr_t) {}
  JsonValue(bool b) : data(b) {}
  /// Any integer type except bool becomes Int.
  template <typename T, std::enable_if_t<std::is_integral_v<T> &&
                                             !std::is_same_v<T, bool>,
                                         int> = 0>
  JsonValue(T i) : data(static_cast<int64_t>(i)) {}
  JsonValue(double d) : data(d) {}
  JsonValue(std::string s) : data(std::move(s)) {}
  JsonValue(std::string_view s) : data(std::string(s)) {}
  JsonValue(const char *s) : data(std::string(s)) {}
  JsonValue(JsonArray a) : data(std::move(a)) {}
  JsonValue(JsonObject o) : data(std::move(o)) {}

  /// An object with \p members in the given order.
  static JsonValue object(std::initializer_list<std::pair<std::string, JsonValue>> members = {});
  /// An array of \p items.
  static JsonValue array(std::initializer_list<JsonValue> items = {});

  Kind kind() const { return static_cast<Kind>(data.index()); }
  /// "null", "boolean", "integer", "number", "string", "array", "object".
  static const char *kindName(Kind kind);
  const char *kindName() const { return kindName(kind()); }

  bool isNull() const { return kind() == Kind::Null; }
  bool isBool() const { return kind() == Kind::Bool; }
  bool isInt() const { return kind() == Kind::Int; }
  bool isNumber() const { return isInt() || kind() == Kind::Double; }
  bool isString() const { return kind() == Kind::String; }
  bool isArray() const { return kind() == Kind::Array; }
  bool isObject() const { return kind() == Kind::Object; }

  // Accessors. Each throws std::logic_error on the wrong kind: callers that
  // validate input check the kind first and report a RuntimeError themselves.
  bool asBool() const;
  int64_t asInt() const;
  /// Int or Double as a double.
  double asDouble() const;
  const std::string &asString() const;
  const JsonArray &asArray() const;
  JsonArray &asArray();
  const JsonObject &asObject() const;
  JsonObject &asObject();

  /// The member \p key of an object, or nullptr when absent or not an object.
  const JsonValue *find(std::string_view key) const;
  JsonValue *find(std::string_view key);
  /// Sets member \p key of an object (replacing it in place, else appending).
  JsonValue &set(std::string key, JsonValue value);
  /// Removes member \p key of an object; false when it was absent.
  bool erase(std::string_view key);
  /// Appends \p value to an array.
  void push(JsonValue value);

  /// Compact JSON (indent < 0) or pretty-printed with \p indent spaces.
  /// Non-finite doubles are written as null: JSON has no NaN/Infinity;
  /// invalid UTF-8 in strings becomes U+FFFD.
  std::string dump(int indent = -1) const;

private:
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, JsonArray,
               JsonObject>
      data;
};

/// Deepest array/object nesting parseJson accepts.
constexpr int kMaxJsonDepth = 256;

/// Parses exactly one JSON value from \p text (surrounding whitespace
/// allowed). Bad text is a RuntimeError (exit code 2) naming \p source (a
/// file name, or "file:line" for JSONL) and, for syntax errors, the 0-based
/// offset of the offending byte ("f.json: JSON at byte 3: syntax error ...").
JsonValue parseJson(std::string_view text, const std::string &source = "<json>");

/// Reads and parses the whole file \p path; a missing or unreadable file is
/// a RuntimeError (exit code 2) naming it.
JsonValue readJsonFile(const std::string &path);

/// \p text as a quoted JSON string: ", \ and control characters escaped
/// (\n, \t, ... or \u00XX); UTF-8 is kept, invalid UTF-8 bytes become
/// U+FFFD.
std::string jsonQuote(std::string_view text);

/// \p d as JSON: the shortest text that reads back as the same double,
/// always with a "." or an exponent ("null" when not finite).
std::string jsonNumber(double d);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_JSON_H
