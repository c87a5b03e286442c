//===- GenerateCommand.h - `adapt generate` ---------------------*- C++ -*-===//
#ifndef ADAPT_TOOLS_GENERATECOMMAND_H
#define ADAPT_TOOLS_GENERATECOMMAND_H

#include "agent/Agent.h"

#include <string>

namespace adapt {

/// What `adapt generate` does, as its flags (or an MCP tool's arguments) say it.
struct GenerateOptions {
  std::string path, out, registry, only;
  agent::LlmConfig llm;
};

/// Usage lines of `adapt generate`, for the CLI's help text.
extern const char *const kGenerateUsage;

/// `adapt generate PATH --out DIR [...]`: a candidate for every gap (reuse
/// rules first, then the LLM loop). Exit 0 every gap has a candidate, 3 some
/// gap has none (needs an LLM or every attempt failed), 2 bad input.
int runGenerateCommand();

/// The candidates \p options ask for, with the same checks, records and exit
/// codes.
int generateCandidates(GenerateOptions options);

/// Sets \p llm's endpoint (ADAPT_LLM_BASE_URL, else OPENAI_BASE_URL), model
/// (ADAPT_LLM_MODEL) and key (ADAPT_LLM_API_KEY, else OPENAI_API_KEY) from the
/// environment, "" where unset, and its first retry delay from
/// ADAPT_LLM_BACKOFF_MS where set: the LLM settings of a caller with no flags
/// (the MCP server's, from its environment at start).
void llmFromEnvironment(agent::LlmConfig &llm);

} // namespace adapt

#endif // ADAPT_TOOLS_GENERATECOMMAND_H
