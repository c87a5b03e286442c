//===- GenerateCommand.h - `adapt generate` ---------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_GENERATECOMMAND_H
#define ADAPT_TOOLS_GENERATECOMMAND_H

namespace adapt {

/// Usage lines of `adapt generate`, for the CLI's help text.
extern const char *const kGenerateUsage;

/// `adapt generate PATH --out DIR [...]`: a candidate for every gap (reuse
/// rules first, then the LLM loop). Exit 0 every gap has a candidate, 3 some
/// gap has none (needs an LLM or every attempt failed), 2 bad input.
int runGenerateCommand();

} // namespace adapt

#endif // ADAPT_TOOLS_GENERATECOMMAND_H
