//===- ReviewCommand.h - `adapt review` -------------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_REVIEWCOMMAND_H
#define ADAPT_TOOLS_REVIEWCOMMAND_H

namespace adapt {

/// Usage lines of `adapt review`, for the CLI's help text.
extern const char *const kReviewUsage;

/// `adapt review DIR [--approve ID | --reject ID --reason TEXT] [--by NAME]
/// [--export FILE]`: shows candidates (diffs, IR before/after, evidence),
/// records decisions with the hash of what was seen, exports approved ones.
int runReviewCommand();

} // namespace adapt

#endif // ADAPT_TOOLS_REVIEWCOMMAND_H
