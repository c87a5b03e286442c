//===- GapReport.cpp - helpers on the gap analysis data ---------*- C++ -*-===//
//
// Status names as they appear in gaps.json and the verdict that decides the
// exit code of `adapt gaps`. Kept beside the plain data so every writer and
// the CLI agree on both.
//
//===----------------------------------------------------------------------===//

#include "passes/GapReport.h"

#include <cctype>

namespace adapt {

const char *gapStatusName(GapStatus status) {
  switch (status) {
  case GapStatus::Missing: return "missing";
  case GapStatus::Partial: return "partial";
  case GapStatus::Supported: return "supported";
  case GapStatus::Excluded: return "excluded";
  }
  return "missing";
}

bool GapReport::hasGaps() const {
  for (const ComponentGap &component : components)
    if (component.status == GapStatus::Missing || component.status == GapStatus::Partial)
      return true;
  return !manifest.issues.empty();
}

std::string structuralHint(const std::string &path) {
  std::string key = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
  for (char &c : key)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto endsWith = [&](const char *suffix) {
    const std::string s(suffix);
    return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
  };
  auto startsWith = [&](const char *prefix) { return key.rfind(prefix, 0) == 0; };
  for (const char *suffix : {"_layers", "_layer", "_layer_ids", "_list", "_pattern", "_interval", "_freq"})
    if (endsWith(suffix))
      return "names layers: which layers do what may change";
  for (const char *suffix : {"_type", "_types", "_kind", "_mode", "_method", "_func", "_impl"})
    if (endsWith(suffix))
      return "names a kind: an unread kind may compute something else";
  for (const char *suffix : {"_size", "_dim", "_dims", "_heads", "_experts", "_rank", "_width", "_kernel",
                             "_factor", "_ratio", "_token", "_tokens", "_groups"})
    if (endsWith(suffix))
      return "reads like a size or count: tensor shapes or parameter counts may change";
  if (startsWith("num_") || startsWith("n_"))
    return "reads like a count: tensor shapes or parameter counts may change";
  if (key.find("share") != std::string::npos || key.find("tie") != std::string::npos)
    return "reads like weight sharing: tensors may be reused across places";
  if (startsWith("use_") || startsWith("enable_") || startsWith("with_") || startsWith("has_"))
    return "switches a feature: the computation may change";
  return "";
}

} // namespace adapt
