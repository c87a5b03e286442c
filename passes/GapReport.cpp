//===- GapReport.cpp - helpers on the gap analysis data ---------*- C++ -*-===//
//
// Status names as they appear in gaps.json and the verdict that decides the
// exit code of `adapt gaps`. Kept beside the plain data so every writer and
// the CLI agree on both.
//
//===----------------------------------------------------------------------===//

#include "passes/GapReport.h"

namespace adapt {

const char *gapStatusName(GapStatus status) {
  switch (status) {
  case GapStatus::Missing:
    return "missing";
  case GapStatus::Partial:
    return "partial";
  case GapStatus::Supported:
    return "supported";
  case GapStatus::Excluded:
    return "excluded";
  }
  return "missing";
}

bool GapReport::hasGaps() const {
  for (const ComponentGap &component : components)
    if (component.status == GapStatus::Missing || component.status == GapStatus::Partial)
      return true;
  return !manifest.issues.empty();
}

} // namespace adapt
