//===- PlanCommand.h - `adapt plan` -----------------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_PLANCOMMAND_H
#define ADAPT_TOOLS_PLANCOMMAND_H

namespace adapt {

/// Usage lines of `adapt plan`, for the CLI's help text.
extern const char *const kPlanUsage;

/// `adapt plan PATH --gpus N [...]`: the parallel layout, memory and step
/// time for training PATH's LoRA on N GPUs (planner/Planner.h). Exit 0 a
/// layout fits, 3 none fits (the reason and what would fit are printed),
/// 2 bad input or usage.
int runPlanCommand();

} // namespace adapt

#endif // ADAPT_TOOLS_PLANCOMMAND_H
