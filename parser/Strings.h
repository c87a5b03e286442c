//===- Strings.h - small string helpers of the compiler side ----*- C++ -*-===//
//
// What C++17's std::string lacks and every folder wanted (C++20 has
// ends_with). Header-only, no LLVM: parser/ links without it.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_STRINGS_H
#define ADAPT_PARSER_STRINGS_H

#include <string>

namespace adapt {

/// Whether \p s ends with \p suffix.
inline bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace adapt

#endif // ADAPT_PARSER_STRINGS_H
