//===- TrainConfig.cpp - the trainer's flags from a YAML file -------------===//

#include "runtime/TrainConfig.h"

#include "runtime/CommandLine.h"
#include "runtime/Errors.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace adapt::rt {

namespace {

std::string trim(const std::string &s) {
  const size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos)
    return "";
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

/// The text before a comment (a # at the start or after a blank, outside quotes).
std::string withoutComment(const std::string &s) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (quote) {
      if (s[i] == quote)
        quote = 0;
    } else if (s[i] == '"' || s[i] == '\'') {
      quote = s[i];
    } else if (s[i] == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return s.substr(0, i);
    }
  }
  return s;
}

} // namespace

std::vector<ConfigSetting> readTrainConfig(const std::string &path, const std::set<std::string> &valueFlags,
                                           const std::set<std::string> &boolFlags) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw badInput(path, "--config", "expected a readable YAML file");
  std::vector<ConfigSetting> out;
  std::set<std::string> seen;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    const std::string where = path + ":" + std::to_string(number);
    if (number > 10000 || text.size() > 65536)
      throw badInput(where, "--config", "expected a short file of `key: value` lines");
    const std::string line = withoutComment(text);
    if (trim(line).empty() || (number == 1 && trim(line) == "---"))
      continue;
    if (line[0] == ' ' || line[0] == '\t')
      throw badInput(where, "--config", "expected `key: value` at the start of the line (nested settings are "
                                        "not flags)");
    const size_t colon = line.find(':');
    if (colon == std::string::npos || trim(line).rfind("- ", 0) == 0)
      throw badInput(where, "--config", "expected `key: value`");
    std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    std::replace(key.begin(), key.end(), '_', '-');
    const std::string flag = "--" + key;
    if (flag == "--config" || flag == "--help")
      throw badInput(where, key, "expected a training setting (" + key + " is a command-line flag only)");
    if (!valueFlags.count(flag) && !boolFlags.count(flag)) {
      std::set<std::string> keys;
      for (const auto *set : {&valueFlags, &boolFlags})
        for (const std::string &f : *set)
          if (f.rfind("--", 0) == 0)
            keys.insert(f.substr(2));
      const std::string near = nearestFlag(key, keys);
      throw badInput(where, key, "expected a trainer setting (train --help lists them)" +
                                     (near.empty() ? std::string() : "; did you mean '" + near + "'?"));
    }
    if (!seen.insert(flag).second)
      throw badInput(where, key, "expected each setting once");
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    else if (value.empty() || value == "|" || value == ">" || value[0] == '[' || value[0] == '{' ||
             value[0] == '&' || value[0] == '*' || value[0] == '"' || value[0] == '\'')
      throw badInput(where, key, "expected one scalar value on the line");
    if (boolFlags.count(flag)) {
      if (value == "true" || value == "yes")
        out.push_back({flag, "", number});
      else if (value != "false" && value != "no")
        throw badInput(where, key, "expected true or false but got '" + value + "'");
      continue;
    }
    out.push_back({flag, value, number});
  }
  return out;
}

} // namespace adapt::rt
