//===- ParallelStage.h - the validation ladder's parallel stage --*- C++ -*-===//
#ifndef ADAPT_TOOLS_PARALLELSTAGE_H
#define ADAPT_TOOLS_PARALLELSTAGE_H

#include <string>
#include <vector>

namespace adapt {

/// What `adapt validate PATH --stage parallel` was asked to do.
struct ParallelStageOptions {
  std::string path, out, runtimeDir;
  std::vector<std::string> layouts; ///< Empty: every layout the issue lists.
  int steps = 6;
};

/// Builds PATH's trainer, trains it alone and under each layout as separate
/// processes on this machine (gloo on CPU, fp32, torchrun's variables) and
/// compares per-step losses, every step's adapter gradients and the exported
/// adapter with the single-process run; writes OUT/parallel-stage.json and
/// .md. Exit 0 every layout run passed, 4 one failed, 2 bad input. The
/// trainer is built in-process (buildTrainer).
int runParallelStage(const ParallelStageOptions &options);

} // namespace adapt

#endif // ADAPT_TOOLS_PARALLELSTAGE_H
