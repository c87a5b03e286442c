//===- Json.cpp - a small JSON value, strict parser and writer ------------===//
//
// A recursive-descent parser over a string_view. Recursion is bounded by
// kMaxJsonDepth, so hostile input cannot overflow the stack; numbers are
// scanned against the RFC grammar before conversion, so "01", "1.", "-" and
// "NaN" are errors rather than whatever strtod makes of them.
//
//===----------------------------------------------------------------------===//
#include "runtime/Json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
[[noreturn]] void wrongKind(const char *wanted, JsonValue::Kind have) {
  throw std::logic_error(std::string("JSON value is ") +
                         JsonValue::kindName(have) + ", not " + wanted);
}
} // namespace

bool JsonValue::asBool() const {
  if (!isBool())
    wrongKind("boolean", kind());
  return std::get<bool>(data);
}

int64_t JsonValue::asInt() const {
  if (!isInt())
    wrongKind("integer", kind());
  return std::get<int64_t>(data);
}

double JsonValue::asDouble() const {
  if (isInt())
    return static_cast<double>(std::get<int64_t>(data));
  if (kind() != Kind::Double)
    wrongKind("number", kind());
  return std::get<double>(data);
}

const std::string &JsonValue::asString() const {
  if (!isString())
    wrongKind("string", kind());
  return std::get<std::string>(data);
}

const JsonArray &JsonValue::asArray() const {
  if (!isArray())
    wrongKind("array", kind());
  return std::get<JsonArray>(data);
}

JsonArray &JsonValue::asArray() {
  if (!isArray())
    wrongKind("array", kind());
  return std::get<JsonArray>(data);
}

const JsonObject &JsonValue::asObject() const {
  if (!isObject())
    wrongKind("object", kind());
  return std::get<JsonObject>(data);
}

JsonObject &JsonValue::asObject() {
  if (!isObject())
    wrongKind("object", kind());
  return std::get<JsonObject>(data);
}

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

std::string jsonQuote(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20 || c == 0x7f) {
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      } else {
        out += ch;
      }
    }
  }
  out += '"';
  return out;
}

std::string jsonNumber(double d) {
  if (!std::isfinite(d))
    return "null";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  std::string out(buf, res.ptr);
  // "1e+20" and "5" are valid JSON; keep a marker that this is a double so
  // that it reads back as Double, not Int.
  if (out.find_first_of(".eE") == std::string::npos)
    out += ".0";
  return out;
}

void JsonValue::dumpTo(std::string &out, int indent, int depth) const {
  auto newline = [&](int level) {
    if (indent < 0)
      return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * level, ' ');
  };
  switch (kind()) {
  case Kind::Null: out += "null"; return;
  case Kind::Bool: out += std::get<bool>(data) ? "true" : "false"; return;
  case Kind::Int: out += std::to_string(std::get<int64_t>(data)); return;
  case Kind::Double: out += jsonNumber(std::get<double>(data)); return;
  case Kind::String: out += jsonQuote(std::get<std::string>(data)); return;
  case Kind::Array: {
    const JsonArray &items = std::get<JsonArray>(data);
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i)
        out += ',';
      newline(depth + 1);
      items[i].dumpTo(out, indent, depth + 1);
    }
    if (!items.empty())
      newline(depth);
    out += ']';
    return;
  }
  case Kind::Object: {
    const JsonObject &members = std::get<JsonObject>(data);
    out += '{';
    for (size_t i = 0; i < members.size(); ++i) {
      if (i)
        out += ',';
      newline(depth + 1);
      out += jsonQuote(members[i].first);
      out += indent < 0 ? ":" : ": ";
      members[i].second.dumpTo(out, indent, depth + 1);
    }
    if (!members.empty())
      newline(depth);
    out += '}';
    return;
  }
  }
}

std::string JsonValue::dump(int indent) const {
  std::string out;
  dumpTo(out, indent, 0);
  return out;
}

//===----------------------------------------------------------------------===//
// Parser
//===----------------------------------------------------------------------===//

namespace {

class Parser {
public:
  Parser(std::string_view text, const std::string &source)
      : text(text), source(source) {}

  JsonValue parseDocument() {
    skipSpace();
    JsonValue value = parseValue(0);
    skipSpace();
    if (pos != text.size())
      fail("expected the end of the JSON text after the value but found " +
           describeHere());
    return value;
  }

private:
  std::string_view text;
  const std::string &source;
  size_t pos = 0;

  [[noreturn]] void fail(const std::string &expected) const {
    throw JsonParseError(source, pos, expected);
  }
  [[noreturn]] void failAt(size_t at, const std::string &expected) {
    pos = at;
    fail(expected);
  }

  /// The character at pos, printable, for messages.
  std::string describeHere() const {
    if (pos >= text.size())
      return "the end of the input";
    unsigned char c = static_cast<unsigned char>(text[pos]);
    if (c >= 0x20 && c < 0x7f)
      return std::string("'") + static_cast<char>(c) + "'";
    char buf[16];
    std::snprintf(buf, sizeof(buf), "byte 0x%02x", c);
    return buf;
  }

  void skipSpace() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' ||
                                 text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }

  void expectLiteral(std::string_view word) {
    if (text.substr(pos, word.size()) != word)
      fail("expected a JSON value (object, array, string, number, true, "
           "false or null) but found " + describeHere());
    pos += word.size();
  }

  JsonValue parseValue(int depth) {
    if (pos >= text.size())
      fail("expected a JSON value but found the end of the input");
    char c = text[pos];
    switch (c) {
    case '{': return parseObject(depth);
    case '[': return parseArray(depth);
    case '"': return JsonValue(parseString());
    case 't': expectLiteral("true"); return JsonValue(true);
    case 'f': expectLiteral("false"); return JsonValue(false);
    case 'n': expectLiteral("null"); return JsonValue(nullptr);
    default:
      if (c == '-' || (c >= '0' && c <= '9'))
        return parseNumber();
      fail("expected a JSON value (object, array, string, number, true, "
           "false or null) but found " + describeHere());
    }
  }

  void enter(int depth) {
    if (depth >= kMaxJsonDepth)
      fail("expected at most " + std::to_string(kMaxJsonDepth) +
           " nested arrays/objects");
  }

  JsonValue parseObject(int depth) {
    enter(depth);
    ++pos; // '{'
    JsonObject members;
    // Duplicate keys: a linear scan for small objects, a hash set once an
    // object is big (index files have ~100k keys).
    std::unordered_set<std::string> bigKeys;
    constexpr size_t kLinearKeys = 16;
    skipSpace();
    if (pos < text.size() && text[pos] == '}') {
      ++pos;
      return JsonValue(std::move(members));
    }
    for (;;) {
      skipSpace();
      if (pos >= text.size() || text[pos] != '"')
        fail("expected a string key in the object but found " + describeHere());
      size_t keyAt = pos;
      std::string key = parseString();
      bool duplicate = false;
      if (members.size() < kLinearKeys) {
        for (const auto &member : members)
          duplicate = duplicate || member.first == key;
      } else {
        if (bigKeys.empty())
          for (const auto &member : members)
            bigKeys.insert(member.first);
        duplicate = !bigKeys.insert(key).second;
      }
      if (duplicate)
        failAt(keyAt, "expected unique keys but " + jsonQuote(key) +
                          " appears twice in the object");
      skipSpace();
      if (pos >= text.size() || text[pos] != ':')
        fail("expected ':' after the key " + jsonQuote(key) + " but found " +
             describeHere());
      ++pos;
      skipSpace();
      JsonValue value = parseValue(depth + 1);
      members.emplace_back(std::move(key), std::move(value));
      skipSpace();
      if (pos < text.size() && text[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < text.size() && text[pos] == '}') {
        ++pos;
        return JsonValue(std::move(members));
      }
      fail("expected ',' or '}' in the object but found " + describeHere());
    }
  }

  JsonValue parseArray(int depth) {
    enter(depth);
    ++pos; // '['
    JsonArray items;
    skipSpace();
    if (pos < text.size() && text[pos] == ']') {
      ++pos;
      return JsonValue(std::move(items));
    }
    for (;;) {
      skipSpace();
      items.push_back(parseValue(depth + 1));
      skipSpace();
      if (pos < text.size() && text[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < text.size() && text[pos] == ']') {
        ++pos;
        return JsonValue(std::move(items));
      }
      fail("expected ',' or ']' in the array but found " + describeHere());
    }
  }

  unsigned hex4() {
    if (pos + 4 > text.size())
      fail("expected 4 hex digits after \\u but found the end of the input");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text[pos];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("expected 4 hex digits after \\u but found " + describeHere());
      ++pos;
    }
    return v;
  }

  static void appendUtf8(std::string &out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  /// Length of the valid UTF-8 sequence starting at pos (0 when invalid):
  /// no overlong forms, no surrogates, nothing above U+10FFFF.
  size_t utf8Length() const {
    auto at = [&](size_t i) -> unsigned {
      return pos + i < text.size() ? static_cast<unsigned char>(text[pos + i]) : 0;
    };
    unsigned c = at(0);
    auto cont = [&](size_t i) { return (at(i) & 0xc0) == 0x80; };
    if (c >= 0xc2 && c <= 0xdf)
      return cont(1) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
      unsigned c1 = at(1);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f))
        return 0;
      return cont(1) && cont(2) ? 3 : 0;
    }
    if (c >= 0xf0 && c <= 0xf4) {
      unsigned c1 = at(1);
      if ((c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f))
        return 0;
      return cont(1) && cont(2) && cont(3) ? 4 : 0;
    }
    return 0;
  }

  std::string parseString() {
    ++pos; // opening quote
    std::string out;
    for (;;) {
      if (pos >= text.size())
        fail("expected a closing '\"' but found the end of the input");
      unsigned char c = static_cast<unsigned char>(text[pos]);
      if (c == '"') {
        ++pos;
        return out;
      }
      if (c < 0x20)
        fail("expected no raw control characters in a string (escape them) "
             "but found " + describeHere());
      if (c == '\\') {
        size_t escapeAt = pos;
        ++pos;
        if (pos >= text.size())
          fail("expected an escape character after '\\' but found the end of "
               "the input");
        char e = text[pos++];
        switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff)
            failAt(escapeAt, "expected a high surrogate before a low "
                             "surrogate \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (text.substr(pos, 2) != "\\u")
              failAt(escapeAt, "expected a \\u low surrogate after the high "
                               "surrogate escape");
            pos += 2;
            unsigned lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff)
              failAt(escapeAt, "expected a low surrogate (\\uDC00-\\uDFFF) "
                               "after the high surrogate escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          appendUtf8(out, cp);
          break;
        }
        default:
          failAt(escapeAt, std::string("expected one of \\\" \\\\ \\/ \\b \\f "
                                       "\\n \\r \\t \\uXXXX but found \\") + e);
        }
        continue;
      }
      if (c < 0x80) {
        out += static_cast<char>(c);
        ++pos;
        continue;
      }
      size_t n = utf8Length();
      if (n == 0)
        fail("expected valid UTF-8 in the string but found " + describeHere());
      out.append(text.data() + pos, n);
      pos += n;
    }
  }

  JsonValue parseNumber() {
    size_t start = pos;
    bool isInteger = true;
    if (text[pos] == '-')
      ++pos;
    auto digit = [&] { return pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; };
    if (!digit())
      fail("expected a digit in the number but found " + describeHere());
    if (text[pos] == '0') {
      ++pos;
      if (digit())
        fail("expected no leading zeros in the number");
    } else {
      while (digit())
        ++pos;
    }
    if (pos < text.size() && text[pos] == '.') {
      isInteger = false;
      ++pos;
      if (!digit())
        fail("expected a digit after the decimal point but found " + describeHere());
      while (digit())
        ++pos;
    }
    if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
      isInteger = false;
      ++pos;
      if (pos < text.size() && (text[pos] == '+' || text[pos] == '-'))
        ++pos;
      if (!digit())
        fail("expected a digit in the exponent but found " + describeHere());
      while (digit())
        ++pos;
    }
    const char *first = text.data() + start;
    const char *last = text.data() + pos;
    if (isInteger) {
      int64_t value = 0;
      auto res = std::from_chars(first, last, value);
      if (res.ec == std::errc() && res.ptr == last)
        return JsonValue(value);
      // Out of int64 range: keep it as a double, like other parsers do.
    }
    // strtod needs a terminated string; numbers are short.
    std::string copy(first, last);
    errno = 0;
    double d = std::strtod(copy.c_str(), nullptr);
    if (!std::isfinite(d))
      failAt(start, "expected a number within the double range but found " + copy);
    return JsonValue(d);
  }
};

} // namespace

JsonValue parseJson(std::string_view text, const std::string &source) {
  return Parser(text, source).parseDocument();
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
