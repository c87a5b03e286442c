//===- CommandLine.cpp - the runtime programs' one flag parser ------------===//

#include "runtime/CommandLine.h"

#include "runtime/Errors.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace adapt::rt {

namespace {

size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// A number as messages print it: "0", "1e-08".
std::string numberText(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

} // namespace

std::string nearestFlag(const std::string &unknown, const std::set<std::string> &flags) {
  std::string best;
  size_t bestDistance = 3;
  for (const std::string &flag : flags) {
    const size_t d = editDistance(unknown, flag);
    if (d < bestDistance || (best.empty() && unknown.size() > 3 && flag.rfind(unknown, 0) == 0)) {
      best = flag;
      bestDistance = std::min(d, bestDistance);
    }
  }
  return best;
}

ParsedFlags parseFlags(int argc, char **argv, const FlagSpec &spec) {
  ParsedFlags parsed;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    bool inlineValue = false;
    if (size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inlineValue = true;
    }
    if (spec.switches.count(flag)) {
      if (inlineValue)
        throw badInput("", flag, "expected no value");
    } else if (spec.valued.count(flag)) {
      if (!inlineValue) {
        if (i + 1 >= argc)
          throw badInput("", flag, "expected a value after the flag");
        value = argv[++i];
      }
    } else {
      std::set<std::string> all = spec.valued;
      all.insert(spec.switches.begin(), spec.switches.end());
      const std::string near = flag.rfind('-', 0) == 0 ? nearestFlag(flag, all) : "";
      throw badInput("", flag,
                     std::string(flag.rfind('-', 0) == 0 ? "expected a known flag (see --help)"
                                                         : "expected a flag, not an argument") +
                         (near.empty() ? std::string() : "; did you mean " + near + "?"));
    }
    std::vector<std::string> &values = parsed.values[flag];
    if (!values.empty() && !spec.repeatable.count(flag))
      throw badInput("", flag, "expected the flag at most once");
    values.push_back(value);
  }
  return parsed;
}

int64_t parseInteger(const std::string &flag, const std::string &text, int64_t min, int64_t max) {
  int64_t v = 0;
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc() || res.ptr != text.data() + text.size() || v < min || v > max)
    throw badInput("", flag,
                   "expected an integer >= " + std::to_string(min) +
                       (max == INT64_MAX ? std::string() : " and <= " + std::to_string(max)) +
                       " but got '" + text + "'");
  return v;
}

double parseNumber(const std::string &flag, const std::string &text, double min) {
  char *end = nullptr;
  double v = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < min)
    throw badInput("", flag, "expected a number >= " + numberText(min) + " but got '" + text + "'");
  return v;
}

const std::string *ParsedFlags::find(const std::string &flag) const {
  auto it = values.find(flag);
  return it == values.end() ? nullptr : &it->second.back();
}

std::string ParsedFlags::text(const std::string &flag, const std::string &fallback) const {
  const std::string *value = find(flag);
  return value ? *value : fallback;
}

int64_t ParsedFlags::integer(const std::string &flag, int64_t fallback, int64_t min,
                             int64_t max) const {
  const std::string *value = find(flag);
  return value ? parseInteger(flag, *value, min, max) : fallback;
}

std::string ParsedFlags::choice(const std::string &flag, const std::string &fallback,
                                const std::set<std::string> &choices) const {
  const std::string *value = find(flag);
  if (!value)
    return fallback;
  if (!choices.count(*value)) {
    std::string list;
    for (const std::string &c : choices)
      list += (list.empty() ? "" : " or ") + c;
    throw badInput("", flag, "expected " + list + " but got '" + *value + "'");
  }
  return *value;
}

} // namespace adapt::rt
