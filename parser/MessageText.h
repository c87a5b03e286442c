//===- MessageText.h - untrusted text made safe for error messages -*- C++ -*-===//
//
// Error messages name the file, field and expectation; they must never carry
// the bytes of the file itself. A client of `adapt serve` could otherwise point
// a tool at a secret and read it back from the error (docs/security.md). These
// helpers quote user text (a tensor name, a dtype) safely and strip the input
// bytes nlohmann's parse errors quote. Header-only: the fuzz targets compile
// the parser files one by one.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_MESSAGETEXT_H
#define ADAPT_PARSER_MESSAGETEXT_H

#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <string_view>

namespace adapt {

/// \p text made safe for a one-line message: control bytes (and with
/// \p asciiOnly all non-ASCII bytes) become \xNN and long text is cut, so a
/// hostile name cannot forge or flood the output.
inline std::string printable(std::string_view text, size_t max = 200,
                             bool asciiOnly = false) {
  static const char kHex[] = "0123456789abcdef";
  size_t cut = std::min(text.size(), max);
  while (cut > 0 && cut < text.size() && (text[cut] & 0xc0) == 0x80)
    --cut; // Never split a UTF-8 sequence.
  std::string out;
  for (size_t i = 0; i < cut; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f || (asciiOnly && c >= 0x80)) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut < text.size())
    out += "...";
  return out;
}

/// \p message without the input bytes a nlohmann lexer error quotes
/// ("...; last read: 'root:x:0:0'; expected ..." loses its "last read" part).
/// The byte offset, which every caller reports, locates the error instead.
inline std::string withoutQuotedInput(std::string_view message) {
  constexpr std::string_view kLastRead = "; last read: '";
  size_t start = message.find(kLastRead);
  if (start == std::string_view::npos)
    return std::string(message);
  // The quoted token ends at "'; expected" when the parser adds what it
  // expected, else at the message's final quote.
  size_t end = message.find("'; expected ", start + kLastRead.size());
  size_t resume = end == std::string_view::npos ? std::string_view::npos : end + 1;
  std::string out(message.substr(0, start));
  if (resume != std::string_view::npos)
    out += message.substr(resume);
  return out;
}

/// The message of a nlohmann exception without its "[json.exception...]"
/// prefix or the input bytes it quotes, made printable.
inline std::string jsonErrorText(const std::exception &ex) {
  std::string_view what = ex.what();
  if (!what.empty() && what.front() == '[') {
    size_t close = what.find("] ");
    if (close != std::string_view::npos)
      what.remove_prefix(close + 2);
  }
  return printable(withoutQuotedInput(what), 300, /*asciiOnly=*/true);
}

/// What a reader reports when parsing \p what ("an index", "a header")
/// threw; call it inside the reader's catch (...) block. Too large for
/// memory, or nlohmann's reason without the input bytes it quotes.
inline std::string parseFailureText(const char *what) {
  try {
    throw;
  } catch (const std::bad_alloc &) {
    return std::string("expected ") + what + " that fits in memory";
  } catch (const std::exception &ex) {
    return "expected valid JSON: " + jsonErrorText(ex);
  } catch (...) {
    return "expected valid JSON";
  }
}

/// What a streaming (SAX) JSON reader reports for malformed input: the byte
/// \p position where parsing stopped and nlohmann's reason \p ex.
inline std::string invalidJsonText(std::size_t position, const std::exception &ex) {
  return "expected valid JSON but byte " + std::to_string(position) +
         " is wrong: " + jsonErrorText(ex);
}

} // namespace adapt

#endif // ADAPT_PARSER_MESSAGETEXT_H
