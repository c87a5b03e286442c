//===- Agent.h - reuse rules, the LLM candidate loop, candidate records -*- C++ -*-===//
//
// What `adapt generate` and `adapt review` share. A candidate is one proposed
// way to close one gap of a gaps.json report; it lives in
// DIR/candidates/<id>/ (candidate.json plus the files it lists), see
// docs/agent.md for the layout. No LibTorch here: candidate code is compiled
// and tested in child processes (adapt-candidate-check).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_AGENT_H
#define ADAPT_AGENT_AGENT_H

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace adapt::agent {

using Json = nlohmann::json;

//===-- records ---------------------------------------------------------===//

/// True for operators whose candidates always need an explicit approval:
/// attention of every kind, MoE routing, anything numerical in the loss path.
bool isCriticalOp(const std::string &op);

/// Whether one candidate needs an individual approval: every candidate of a
/// critical op, except reuse rules that change no arithmetic (a renamed
/// weight). Non-critical, validated, unflagged candidates may be approved in
/// bulk (`adapt review --approve-noncritical`).
bool isCriticalCandidate(const std::string &op, const std::string &rule);

/// Writes \p text to \p path (creating folders); false + \p error on failure.
bool writeText(const std::string &path, const std::string &text, std::string &error);

/// Reads a whole file; false when it cannot be read.
bool readText(const std::string &path, std::string &text);

/// Lowercase hex SHA-256 of \p data.
std::string sha256Hex(const std::string &data);

/// The hash a reviewer approves: SHA-256 over candidate.json's claims (id,
/// op, kind, rule, status, critical, validation) and the names and bytes of
/// the files it lists under "files" (what `adapt review` shows).
/// Missing files hash as "<missing>" so deleting one voids an approval too.
std::string candidateContentHash(const std::string &candidateDir, const Json &candidate);

//===-- reuse rules ------------------------------------------------------===//

/// A reuse rule's proposal for one gap: the registry entry that makes the
/// component available and the adapter that maps the model onto it.
struct ReuseMatch {
  std::string rule;        ///< Rule name, e.g. "split_projection_layout".
  std::string explanation; ///< One paragraph: why the rule applies.
  Json registryEntry;      ///< New or changed ops.json entry.
  std::string adapter;     ///< Adapter code / weight mapping (C++ or text).
};

/// Tries every reuse rule on one gaps.json component against the registry
/// (ops.json as JSON). Returns false when no rule covers it.
bool matchReuseRules(const Json &component, const Json &registry, ReuseMatch &match);

//===-- LLM candidates ---------------------------------------------------===//

/// How to reach an OpenAI-compatible Chat Completions endpoint.
struct LlmConfig {
  std::string baseUrl;        ///< e.g. http://127.0.0.1:8000/v1 ("" = none).
  std::string model;
  std::string apiKey;
  int maxAttempts = 4;        ///< Model turns per candidate.
  int64_t maxTokens = 200000; ///< Prompt + completion tokens per candidate.
  int requestTimeoutS = 120;  ///< One HTTP request.
  int retries = 3;            ///< Per request, on timeouts, 5xx, bad JSON.
  int backoffMs = 500;        ///< First retry delay; doubles each retry.
  int testTimeoutS = 60;      ///< One compile or one test run.
  int64_t testMemoryMb = 6144;///< Address-space limit of the test child.
  std::string target = "libtorch"; ///< libtorch | cuda (asked for, not run here).
  /// A validated candidate measured faster than the composite baseline by
  /// more than this factor is flagged for review (`--flag-speedup`).
  double flagSpeedup = 10.0;
};

/// Tools the candidate loop needs from the outside.
struct CandidateTools {
  std::string checker;      ///< Path of adapt-candidate-check ("" = none).
  std::string compiler = "c++";
};

/// The op-stage task of adapt-candidate-check that can validate a
/// candidate for one gap (agent/CandidateTasks.cpp), or why there is none.
struct CandidateTask {
  std::string name;         ///< moe_routing | rope | attention_core | glu_activation; "" = none.
  std::string feature;      ///< The differing feature(s) that chose it, e.g. "sinks=yes".
  std::string closestEntry; ///< The registry entry the component was compared with.
  std::string reason;       ///< When name is empty: why no task applies (precise).
};

/// Chooses the task from the feature that makes \p component a gap: its
/// features against the closest registry entry of its op, the differing
/// feature mapped through the task table. A value the task's reference does
/// not define (e.g. rope=video_rope) gives no task and says so in `reason`;
/// so does a task whose model params \p irText (the op's IR line) lacks.
CandidateTask chooseCandidateTask(const Json &component, const Json &registry,
                                  const std::string &irText);

/// Whether an op-stage task exists for a component (only those can be
/// generated: a candidate nobody can test is never proposed).
bool hasCandidateTask(const Json &component, const Json &registry, const std::string &irText);

/// The task's part of the system prompt: the op's exact semantics, the
/// candidate's inputs and params, the shape shown, this model's params.
std::string candidateTaskPrompt(const CandidateTask &task, const Json &component,
                                const std::string &irText);

/// The checker's model-level params ("--param", "key=value", ...) from the
/// component's features and its IR line.
std::vector<std::string> candidateCheckerParams(const CandidateTask &task, const Json &component,
                                                const std::string &irText);

/// The static check: reasons the source is refused before compiling (calls
/// into the reference, dlopen/dlsym, extern declarations, shelling out).
/// Empty when clean.
std::vector<std::string> staticCheck(const std::string &source);

/// Runs the LLM loop for one component and its task (from
/// chooseCandidateTask); writes prompts, responses, sources, logs and
/// candidate.json into \p candidateDir and returns candidate.json.
/// Never throws: every fault ends as status "failed" with a reason.
Json generateCandidate(const Json &component, const CandidateTask &task,
                       const std::string &irText, const LlmConfig &config,
                       const CandidateTools &tools, const std::string &candidateDir);

} // namespace adapt::agent

#endif // ADAPT_AGENT_AGENT_H
