//===- Validate.h - the model stage of the validation ladder ----*- C++ -*-===//
//
// A generated trainer, run with `--validate FIXTURE`, checks itself against a
// reference fixture (validation/make_fixture.py: transformers + PEFT, fp32):
// it loads the fixture's initial adapter, runs forward and backward on the
// fixture's ids, and compares logits, loss, every adapter gradient and every
// layer's attention, FFN and layer outputs. The record names the first
// component that diverges and whether every routed expert that got tokens
// got a gradient.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_VALIDATE_H
#define ADAPT_RUNTIME_VALIDATE_H

#include "runtime/Errors.h"
#include "runtime/Model.h"

#include <string>

namespace adapt::rt {

/// Runs the model stage for \p model (loaded from \p modelDir) against the
/// fixture folder \p fixtureDir, writes `model-stage.json` and
/// `model-stage.md` into \p outDir and prints a table. Returns 0 when every
/// check passed, kExitCheckFailed when one failed; throws RuntimeError
/// (exit 2) for a missing fixture, a fixture made from other weights, or one
/// whose adapter does not match the trainer's LoRA targets.
int validateModelStage(Model &model, const std::string &modelDir, const std::string &fixtureDir,
                       const std::string &outDir);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_VALIDATE_H
