//===- TrainConfig.h - the trainer's flags from a YAML file ------*- C++ -*-===//
//
// `train --config run.yaml`: every flag of the trainer as a key of a flat YAML
// mapping (`lr: 2e-4`, `eval-data: eval.jsonl`, `rslora: true`; dashes or
// underscores), flags on the command line overriding it. Only what flags can
// say is accepted: one `key: scalar` per line, comments, blank lines and a
// leading `---`; nesting, lists, anchors and multi-line strings are refused
// with the line that holds them, so a file never means something else than
// it reads. Paths are relative to the working directory, as on the command
// line.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TRAINCONFIG_H
#define ADAPT_RUNTIME_TRAINCONFIG_H

#include <set>
#include <string>
#include <vector>

namespace adapt::rt {

/// One setting of a config file: the flag it stands for and its value.
struct ConfigSetting {
  std::string flag;  ///< "--lr"
  std::string value; ///< "2e-4"; "" for a boolean flag that is true.
  int line = 0;
};

/// Reads \p path. \p valueFlags and \p boolFlags are the trainer's flags
/// ("--lr", "--resume"). A boolean key takes true/false (false: the flag is
/// left out). Errors are RuntimeError exit 2 naming PATH:LINE and the key,
/// with the nearest known key for an unknown one.
std::vector<ConfigSetting> readTrainConfig(const std::string &path, const std::set<std::string> &valueFlags,
                                           const std::set<std::string> &boolFlags);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_TRAINCONFIG_H
