//===- Json.cpp - JsonValue over nlohmann-json's parser and writer --------===//
//
// Parsing goes through nlohmann's SAX interface straight into JsonValue, so
// the checks its DOM parser lacks (duplicate keys, depth) sit where the
// values are built; writing converts to nlohmann's ordered_json and
// dumps that. nlohmann's parser keeps no recursion on the stack, so hostile
// nesting cannot overflow it; kMaxJsonDepth bounds what callers walk.
//
//===----------------------------------------------------------------------===//
#include "runtime/Json.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace adapt::rt {

//===----------------------------------------------------------------------===//
// JsonValue
//===----------------------------------------------------------------------===//

JsonValue JsonValue::object(
    std::initializer_list<std::pair<std::string, JsonValue>> members) {
  return JsonValue(JsonObject(members.begin(), members.end()));
}

JsonValue JsonValue::array(std::initializer_list<JsonValue> items) {
  return JsonValue(JsonArray(items.begin(), items.end()));
}

const char *JsonValue::kindName(Kind kind) {
  switch (kind) {
  case Kind::Null: return "null";
  case Kind::Bool: return "boolean";
  case Kind::Int: return "integer";
  case Kind::Double: return "number";
  case Kind::String: return "string";
  case Kind::Array: return "array";
  case Kind::Object: return "object";
  }
  return "?";
}

namespace {
/// The \p T alternative of \p data; std::logic_error when it holds another
/// (a caller that validates input checks the kind first).
template <typename T, typename Variant>
auto &alternative(Variant &data, const char *wanted) {
  if (auto *value = std::get_if<T>(&data))
    return *value;
  throw std::logic_error(std::string("JSON value is ") +
                         JsonValue::kindName(static_cast<JsonValue::Kind>(data.index())) + ", not " + wanted);
}
} // namespace

bool JsonValue::asBool() const { return alternative<bool>(data, "boolean"); }
int64_t JsonValue::asInt() const { return alternative<int64_t>(data, "integer"); }
double JsonValue::asDouble() const {
  return isInt() ? static_cast<double>(asInt()) : alternative<double>(data, "number");
}
const std::string &JsonValue::asString() const { return alternative<std::string>(data, "string"); }
const JsonArray &JsonValue::asArray() const { return alternative<JsonArray>(data, "array"); }
JsonArray &JsonValue::asArray() { return alternative<JsonArray>(data, "array"); }
const JsonObject &JsonValue::asObject() const { return alternative<JsonObject>(data, "object"); }
JsonObject &JsonValue::asObject() { return alternative<JsonObject>(data, "object"); }

const JsonValue *JsonValue::find(std::string_view key) const {
  if (!isObject())
    return nullptr;
  for (const auto &member : std::get<JsonObject>(data))
    if (member.first == key)
      return &member.second;
  return nullptr;
}

JsonValue *JsonValue::find(std::string_view key) {
  return const_cast<JsonValue *>(std::as_const(*this).find(key));
}

JsonValue &JsonValue::set(std::string key, JsonValue value) {
  JsonObject &members = asObject();
  for (auto &member : members)
    if (member.first == key) {
      member.second = std::move(value);
      return member.second;
    }
  members.emplace_back(std::move(key), std::move(value));
  return members.back().second;
}

bool JsonValue::erase(std::string_view key) {
  JsonObject &members = asObject();
  for (auto it = members.begin(); it != members.end(); ++it)
    if (it->first == key) {
      members.erase(it);
      return true;
    }
  return false;
}

void JsonValue::push(JsonValue value) { asArray().push_back(std::move(value)); }

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

namespace {

using Library = nlohmann::ordered_json;

/// \p value as nlohmann's value, members in the same order.
Library toLibrary(const JsonValue &value) {
  switch (value.kind()) {
  case JsonValue::Kind::Null: return nullptr;
  case JsonValue::Kind::Bool: return value.asBool();
  case JsonValue::Kind::Int: return value.asInt();
  case JsonValue::Kind::Double: return value.asDouble();
  case JsonValue::Kind::String: return value.asString();
  case JsonValue::Kind::Array: {
    Library out = Library::array();
    for (const JsonValue &item : value.asArray())
      out.push_back(toLibrary(item));
    return out;
  }
  case JsonValue::Kind::Object: {
    Library out = Library::object();
    // Appended without ordered_map's linear key search (a safetensors header
    // has one member per tensor); JsonValue's keys are already distinct.
    auto &members = out.get_ref<Library::object_t &>();
    for (const auto &[key, item] : value.asObject())
      members.emplace_back(key, toLibrary(item));
    return out;
  }
  }
  return nullptr;
}

/// nlohmann's dump with \p indent (< 0: compact); invalid UTF-8 is replaced
/// rather than thrown, since the strings are file names and user text.
std::string dumpLibrary(const Library &value, int indent) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, Library::error_handler_t::replace);
}

} // namespace

std::string jsonQuote(std::string_view text) { return dumpLibrary(Library(std::string(text)), -1); }

std::string jsonNumber(double d) { return dumpLibrary(Library(d), -1); }

std::string JsonValue::dump(int indent) const { return dumpLibrary(toLibrary(*this), indent); }

//===----------------------------------------------------------------------===//
// Parser
//===----------------------------------------------------------------------===//

namespace {

/// nlohmann's message without its "[json.exception.NAME] " tag and "parse
/// error at line L, column C: " prefix (the caller names the byte), and
/// without the echoed input ("; last read: '...'"), which may hold any bytes
/// of a hostile file.
std::string describe(const std::exception &error) {
  std::string what = error.what();
  if (what.rfind("[json.exception", 0) == 0)
    what.erase(0, what.find("] ") + 2);
  if (what.rfind("parse error", 0) == 0)
    if (size_t colon = what.find(": "); colon != std::string::npos)
      what.erase(0, colon + 2);
  if (size_t lastRead = what.find("; last read: '"); lastRead != std::string::npos) {
    size_t expected = what.find("; expected ", lastRead);
    what.erase(lastRead, expected == std::string::npos ? std::string::npos : expected - lastRead);
  }
  constexpr size_t kMaxLength = 200; // an overflowing number is echoed whole
  return what.size() > kMaxLength ? what.substr(0, kMaxLength) + "..." : what;
}

/// Builds a JsonValue from nlohmann's SAX events, refusing what its DOM
/// parser would let through: a key twice in one object (the last would win)
/// and nesting past kMaxJsonDepth. Every handler returns true or throws a
/// RuntimeError naming the source.
class ValueBuilder final : public nlohmann::json_sax<nlohmann::json> {
public:
  explicit ValueBuilder(const std::string &source) : source(source) {}

  JsonValue result;

  bool null() override { return add(nullptr); }
  bool boolean(bool b) override { return add(b); }
  bool number_integer(number_integer_t i) override { return add(i); }
  bool number_unsigned(number_unsigned_t u) override {
    // Past int64 an integer is kept as a double, as the previous parser did.
    return u <= static_cast<number_unsigned_t>(INT64_MAX) ? add(static_cast<int64_t>(u))
                                                          : add(static_cast<double>(u));
  }
  bool number_float(number_float_t d, const string_t &) override { return add(d); } // finite: nlohmann refuses overflow
  bool string(string_t &s) override { return add(std::move(s)); }
  bool binary(binary_t &) override { return false; } // JSON text has no binary values
  bool start_object(std::size_t) override {
    keys.emplace_back();
    return open(JsonValue::object());
  }
  bool key(string_t &k) override {
    if (!keys.back().insert(k).second)
      throw badInput(source, "JSON key " + jsonQuote(k),
                     "expected each key once in an object but it appears twice");
    pendingKey = std::move(k);
    return true;
  }
  bool end_object() override {
    keys.pop_back();
    containers.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return open(JsonValue::array()); }
  bool end_array() override {
    containers.pop_back();
    return true;
  }
  bool parse_error(std::size_t byte, const std::string &, const nlohmann::detail::exception &error) override {
    // nlohmann counts the bytes read, the offending one included; the
    // message gives the 0-based offset of that byte.
    throw badInput(source, "JSON at byte " + std::to_string(byte > 0 ? byte - 1 : 0), describe(error));
  }

private:
  /// Places \p value in the innermost open array or object (or as the
  /// result) and returns where it now lives.
  JsonValue *place(JsonValue value) {
    if (containers.empty())
      return &(result = std::move(value));
    JsonValue &parent = *containers.back();
    if (parent.isArray()) {
      parent.push(std::move(value));
      return &parent.asArray().back();
    }
    return &parent.asObject().emplace_back(std::move(pendingKey), std::move(value)).second;
  }
  bool add(JsonValue value) {
    place(std::move(value));
    return true;
  }
  /// Opens an array or object. Pointers into a parent stay valid: a parent
  /// gains no members while a child of it is open.
  bool open(JsonValue container) {
    if (containers.size() >= static_cast<size_t>(kMaxJsonDepth))
      throw badInput(source, "JSON nesting",
                     "expected at most " + std::to_string(kMaxJsonDepth) + " nested arrays/objects");
    containers.push_back(place(std::move(container)));
    return true;
  }

  const std::string &source;
  std::vector<JsonValue *> containers;                     ///< Innermost last.
  std::vector<std::unordered_set<std::string>> keys;  ///< One per open object.
  std::string pendingKey;                             ///< Of the next object member.
};

} // namespace

JsonValue parseJson(std::string_view text, const std::string &source) {
  ValueBuilder builder(source);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  return std::move(builder.result);
}

JsonValue readJsonFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw readError(path, "open", errno);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    throw readError(path, "read", errno);
  return parseJson(buffer.str(), path);
}

} // namespace adapt::rt
