//===- ReviewCommand.cpp - `adapt review` ---------------------------------===//
//
//   adapt review DIR [--only ID]
//   adapt review DIR --approve ID [--by NAME]
//   adapt review DIR --approve-noncritical [--by NAME]
//   adapt review DIR --reject ID --reason TEXT [--by NAME]
//   adapt review DIR --export FILE [--registry BASE]
//
// Shows each candidate `adapt generate` left in DIR as a unified diff against
// the library (registry entry before/after, or the new source file), the IR
// line before/after, and its validation evidence. A decision is written to
// DIR/candidates/<id>/review.json with who made it, when, and the SHA-256 of
// the files shown; changing any of them afterwards voids an approval. Only
// approved, unchanged candidates are exported into a registry (--export);
// nothing enters the library any other way.
//
//===----------------------------------------------------------------------===//

#include "tools/ReviewCommand.h"
#include "tools/CommandLine.h"

#include "agent/Agent.h"
#include "agent/ReviewKey.h"
#include "parser/InputError.h"
#include "passes/OpRegistry.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <sstream>

namespace adapt {

const char *const kReviewUsage =
    "  adapt review DIR [--only ID]\n"
    "  adapt review DIR --approve ID [--by NAME] | --reject ID --reason TEXT [--by NAME]\n"
    "  adapt review DIR --approve-noncritical [--by NAME]\n"
    "  adapt review DIR --export FILE [--registry BASE]\n";

namespace {

using agent::Json;

cl::SubCommand reviewCommand("review", "Show candidates and record approvals");
cl::opt<std::string> dirFlag(cl::Positional, cl::sub(reviewCommand),
                             cl::desc("DIR (the --out of adapt generate)"));
cl::opt<std::string> approveFlag("approve", cl::sub(reviewCommand), cl::desc("candidate id"));
cl::opt<std::string> rejectFlag("reject", cl::sub(reviewCommand), cl::desc("candidate id"));
cl::opt<std::string> reasonFlag("reason", cl::sub(reviewCommand), cl::desc("why rejected"));
cl::opt<std::string> byFlag("by", cl::sub(reviewCommand), cl::desc("reviewer (default: $USER)"));
cl::opt<std::string> exportFlag("export", cl::sub(reviewCommand),
                                cl::desc("registry file of the approved candidates"));
cl::opt<std::string> registryFlag("registry", cl::sub(reviewCommand),
                                  cl::desc("the registry generate compared against"));
cl::opt<std::string> onlyFlag("only", cl::sub(reviewCommand), cl::desc("one candidate's id"));
cl::opt<bool> approveNonCriticalFlag("approve-noncritical", cl::sub(reviewCommand),
                                     cl::desc("approve every candidate not flagged critical"));

int usage(const std::string &message) { return usageError(message, kReviewUsage); }

std::vector<std::string> splitLines(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);)
    lines.push_back(l);
  return lines;
}

/// A unified diff of two small texts (one hunk; LCS line alignment).
std::string unifiedDiff(const std::string &a, const std::string &b, const std::string &nameA,
                        const std::string &nameB) {
  std::vector<std::string> x = splitLines(a), y = splitLines(b);
  size_t n = x.size(), m = y.size();
  std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      lcs[i][j] = x[i] == y[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  std::ostringstream os;
  os << "--- " << nameA << "\n+++ " << nameB << "\n@@ -" << (n ? 1 : 0) << "," << n << " +"
     << (m ? 1 : 0) << "," << m << " @@\n";
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] == y[j])
      os << " " << x[i++] << "\n", ++j;
    else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]))
      os << "-" << x[i++] << "\n";
    else
      os << "+" << y[j++] << "\n";
  }
  return os.str();
}

/// A candidate folder's records.
struct Candidate {
  std::string id, dir;
  Json record, review;
};

/// "pending", "approved", "rejected", "void" (approved, then changed) or
/// "forged" (an approval without a valid MAC under this machine's review
/// key: written or rewritten by hand, agent/ReviewKey.h).
std::string reviewState(const Candidate &c) {
  if (c.review.is_null())
    return "pending";
  std::string decision = c.review.value("decision", "");
  if (decision != "approved")
    return decision;
  if (c.review.value("sha256", "") != agent::candidateContentHash(c.dir, c.record))
    return "void";
  std::string key, error;
  if (!agent::reviewKey(key, /*create=*/false, error) ||
      c.review.value("mac", "") != agent::approvalMac(key, c.id, c.review.value("sha256", ""),
                                                      c.review.value("by", "")))
    return "forged";
  return decision;
}

bool loadCandidates(const std::string &dir, std::vector<Candidate> &out, std::string &error) {
  std::string root = dir + "/candidates";
  if (!llvm::sys::fs::is_directory(root)) {
    error = dir + ": no candidates/ folder (run `adapt generate ... --out " + dir + "` first)";
    return false;
  }
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    Candidate c;
    c.dir = it->path();
    c.id = std::string(llvm::sys::path::filename(c.dir));
    std::string text;
    if (!agent::readText(c.dir + "/candidate.json", text))
      continue;
    c.record = Json::parse(text, nullptr, false);
    if (c.record.is_discarded()) {
      error = c.dir + "/candidate.json: not JSON";
      return false;
    }
    if (agent::readText(c.dir + "/review.json", text)) {
      c.review = Json::parse(text, nullptr, false);
      if (c.review.is_discarded())
        c.review = Json();
    }
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(),
            [](const Candidate &a, const Candidate &b) { return a.id < b.id; });
  return true;
}

Json builtinEntry(const Json &registry, const std::string &id) {
  for (const Json &e : registry.value("ops", Json::array()))
    if (e.value("id", "") == id)
      return e;
  return Json();
}

/// The candidate's source file (candidate.cpp, or candidate.cu for CUDA).
std::string sourceFile(const Candidate &c) {
  for (const Json &f : c.record.value("files", Json::array()))
    if (f.is_string()) {
      std::string name = f.get<std::string>();
      if (name == "candidate.cpp" || name == "candidate.cu")
        return name;
    }
  return "candidate.cpp";
}

void show(const Candidate &c, const Json &registry) {
  const Json &r = c.record;
  std::cout << "== " << c.id << "  [" << r.value("kind", "") << "; "
            << (r["rule"].is_string() ? "rule " + r["rule"].get<std::string>() : "no rule")
            << "; " << r.value("status", "") << "; "
            << (r.value("critical", true) ? "critical: approval required"
                                        : "not critical: --approve-noncritical may approve it")
            << "; review: " << reviewState(c) << "]\n";
  std::cout << "   " << r.value("reason", "") << "\n";
  if (r.contains("explanation"))
    std::cout << "   " << r.value("explanation", "") << "\n";
  for (const Json &f : r.value("flags", Json::array()))
    std::cout << "   FLAG: " << f.get<std::string>() << "\n";
  std::string text;
  if (r.value("kind", "") == "reuse" && agent::readText(c.dir + "/registry-entry.json", text)) {
    Json before = builtinEntry(registry, r.value("registry_entry_id", ""));
    std::cout << unifiedDiff(before.is_null() ? "" : before.dump(2) + "\n", text,
                             "a/runtime/registry/ops.json (" + r.value("registry_entry_id", "") + ")",
                             "b/runtime/registry/ops.json (" + r.value("registry_entry_id", "") + ")");
    if (agent::readText(c.dir + "/adapter.txt", text))
      std::cout << unifiedDiff("", text, "/dev/null", "b/runtime/adapters/" + c.id + ".txt");
  } else if (agent::readText(c.dir + "/" + sourceFile(c), text)) {
    std::string ext = sourceFile(c).substr(sourceFile(c).find('.'));
    std::cout << unifiedDiff("", text, "/dev/null", "b/runtime/generated/" + c.id + ext);
  }
  if (!r.value("ir_before", "").empty()) {
    std::cout << "IR before: " << r.value("ir_before", "") << "\n";
    if (!r.value("ir_after", "").empty())
      std::cout << "IR after:  " << r.value("ir_after", "") << "\n";
  }
  if (r.contains("validation")) {
    const Json &v = r["validation"];
    std::cout << "validation: " << v.value("status", "") << ", speed-up over composite "
              << v.value("speedup_over_composite", 0.0) << "x\n";
    for (const Json &check : v.value("checks", Json::array()))
      std::cout << "  " << check.value("status", "") << "  " << check.value("shape", "")
                << "  fwd " << check.value("forward_max_rel_error", 0.0) << "  bwd "
                << check.value("backward_max_rel_error", 0.0) << "\n";
  }
  if (r.contains("tokens"))
    std::cout << "tokens: " << r["tokens"].dump() << ", attempts: "
              << r.value("attempts", Json::array()).size() << "\n";
  std::cout << "sha256: " << agent::candidateContentHash(c.dir, r) << "\n";
  if (!c.review.is_null())
    std::cout << "decision: " << c.review.value("decision", "") << " by "
              << c.review.value("by", "") << " at " << c.review.value("at", "")
              << " (sha256 " << c.review.value("sha256", "").substr(0, 12) << ")"
              << (reviewState(c) == "void"     ? " -- VOID: files changed after approval"
                  : reviewState(c) == "forged" ? " -- FORGED: no valid review MAC (edited by hand?)"
                                               : "")
              << (c.review.contains("reason") ? ", reason: " + c.review.value("reason", "") : "")
              << "\n";
  std::cout << "\n";
}

std::string nowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

/// Writes review.json for \p c: the decision, who, when, the hash of what
/// was shown and whether it is critical; prints one line.
bool recordDecision(const Candidate &c, const std::string &decision, const std::string &by,
                    const std::string &reason, std::string &error) {
  Json review = {{"candidate", c.id},
                 {"decision", decision},
                 {"by", by},
                 {"at", nowUtc()},
                 {"sha256", agent::candidateContentHash(c.dir, c.record)},
                 {"files", c.record.value("files", Json::array())},
                 {"critical", c.record.value("critical", true)}};
  if (!reason.empty())
    review["reason"] = reason;
  if (decision == "approved") {
    std::string key;
    if (!agent::reviewKey(key, /*create=*/true, error))
      return false;
    review["mac"] = agent::approvalMac(key, c.id, review["sha256"].get<std::string>(), by);
  }
  if (!agent::writeText(c.dir + "/review.json", review.dump(2) + "\n", error))
    return false;
  std::cout << decision << " " << c.id << " by " << by << " (sha256 "
            << review.value("sha256", "") << ")\n";
  return true;
}

/// The MAC `adapt build` checks on a generated registry entry: the
/// candidate, the SHA-256 of the source it compiles, the reviewer.
std::string macOfSource(const std::string &candidate, const std::string &sourceSha256, const std::string &by) {
  std::string key, error;
  return agent::reviewKey(key, /*create=*/false, error) ? agent::approvalMac(key, candidate, sourceSha256, by)
                                                         : std::string();
}

/// The registry entry an approved LLM candidate becomes: exactly its
/// component's variant (one value per feature), placed before the op's
/// library entries so it matches first, with the library's LoRA targets and
/// layouts for the op and the source + SHA-256 `adapt build` checks again.
Json generatedEntry(const Candidate &c, const Json &registry) {
  const Json &r = c.record;
  std::string op = r.value("op", "");
  Json match = Json::object();
  const Json features = r.value("features", Json::object());
  for (auto &[key, value] : features.items())
    match[key] = Json::array({value});
  Json loraTargets = Json::array(), parallel = Json::array();
  for (const Json &e : registry.value("ops", Json::array()))
    if (e.value("op", "") == op) {
      for (const Json &t : e.value("lora_targets", Json::array()))
        if (std::find(loraTargets.begin(), loraTargets.end(), t) == loraTargets.end())
          loraTargets.push_back(t);
      if (parallel.empty())
        parallel = e.value("parallel", Json::array());
    }
  std::string source, text;
  llvm::SmallString<256> path(c.dir + "/" + sourceFile(c));
  llvm::sys::fs::make_absolute(path);
  agent::readText(std::string(path), text);
  std::string task = r.contains("task") && r["task"].is_string() ? r["task"].get<std::string>()
                     : op == "adapt.moe"                           ? std::string("moe_routing")
                                                                   : std::string();
  std::string model = r.contains("model") && r["model"].is_string() ? r["model"].get<std::string>()
                                                                    : std::string("an LLM");
  return {{"id", "generated." + c.id},
          {"op", op},
          {"match", match},
          {"forward", true},
          {"backward", true},
          {"dtypes", Json::array({"fp32", "bf16"})},
          {"devices", Json::array({"cpu", "cuda"})},
          {"lora_targets", loraTargets},
          {"parallel", parallel},
          {"status", "implemented"},
          {"note", "generated by " + model + ", passed the op stage (" +
                       task + "), approved by " + c.review.value("by", "")},
          {"implementation",
           {{"kind", "generated"},
            {"candidate", c.id},
            {"task", task},
            {"source", std::string(path)},
            {"sha256", agent::sha256Hex(text)},
            {"approved", {{"by", c.review.value("by", "")},
                          {"at", c.review.value("at", "")},
                          {"review_sha256", c.review.value("sha256", "")},
                          {"mac", macOfSource(c.id, agent::sha256Hex(text), c.review.value("by", ""))}}}}}};
}

} // namespace

int runReviewCommand() {
  std::string dir = dirFlag, approve = approveFlag, reject = rejectFlag, reason = reasonFlag,
              by = byFlag, exportPath = exportFlag, registryPath = registryFlag, only = onlyFlag;
  const bool approveNonCritical = approveNonCriticalFlag;
  if (dir.empty())
    return usage("review expects a DIR (the --out of `adapt generate`)");
  if (int(!approve.empty()) + int(!reject.empty()) + int(approveNonCritical) > 1)
    return usage("--approve, --approve-noncritical and --reject exclude each other");
  if (!reject.empty() && reason.empty())
    return usage("--reject expects --reason TEXT");
  if (by.empty())
    by = std::getenv("USER") ? std::getenv("USER") : "unknown";

  std::string registryText = builtinOpRegistryText(), error;
  if (registryPath.empty()) {
    // The registry generate compared against (generate.json), if not built in.
    std::string text;
    Json summary;
    if (agent::readText(dir + "/generate.json", text) &&
        !(summary = Json::parse(text, nullptr, false)).is_discarded() &&
        summary.contains("registry") && summary["registry"].is_string())
      registryPath = summary["registry"].get<std::string>();
  }
  if (!registryPath.empty() && !agent::readText(registryPath, registryText)) {
    std::cerr << "adapt: error: " << registryPath << ": cannot read the registry\n";
    return kExitBadInput;
  }
  Json registry = Json::parse(registryText, nullptr, false);
  if (registry.is_discarded() || !registry.contains("ops")) {
    std::cerr << "adapt: error: registry is not JSON with \"ops\"\n";
    return kExitBadInput;
  }
  std::vector<Candidate> candidates;
  if (!loadCandidates(dir, candidates, error)) {
    std::cerr << "adapt: error: " << error << "\n";
    return kExitBadInput;
  }

  if (!approve.empty() || !reject.empty()) {
    std::string id = approve.empty() ? reject : approve;
    auto it = std::find_if(candidates.begin(), candidates.end(),
                           [&](const Candidate &c) { return c.id == id; });
    if (it == candidates.end()) {
      std::cerr << "adapt: error: " << dir << ": no candidate '" << id << "'\n";
      return kExitBadInput;
    }
    std::string status = it->record.value("status", "");
    if (!approve.empty() && status != "proposed" && status != "validated") {
      std::cerr << "adapt: error: " << id << ": cannot approve a candidate with status '"
                << status << "' (" << it->record.value("reason", "") << ")\n";
      return kExitBadInput;
    }
    if (!recordDecision(*it, approve.empty() ? "rejected" : "approved", by, reason, error)) {
      std::cerr << "adapt: error: " << error << "\n";
      return kExitBadInput;
    }
    return kExitOk;
  }

  if (approveNonCritical) {
    // Bulk approval is for candidates that change no arithmetic of the loss
    // path and passed what they had to pass; critical ones always need
    // `--approve ID`, one by one.
    int approved = 0;
    for (const Candidate &c : candidates) {
      std::string status = c.record.value("status", ""), state = reviewState(c);
      if ((status != "proposed" && status != "validated") || state == "approved" ||
          state == "rejected")
        continue;
      std::string why = c.record.value("critical", true) ? "critical: needs --approve " + c.id
                        : !c.record.value("flags", Json::array()).empty()
                            ? "flagged: needs --approve " + c.id
                            : "";
      if (!why.empty()) {
        std::cout << "left for review: " << c.id << " (" << why << ")\n";
        continue;
      }
      if (!recordDecision(c, "approved", by, "", error)) {
        std::cerr << "adapt: error: " << error << "\n";
        return kExitBadInput;
      }
      ++approved;
    }
    std::cout << "approved " << approved << " non-critical candidate(s)\n";
    return kExitOk;
  }

  if (!exportPath.empty()) {
    Json out = registry;
    Json generated = Json::array();
    int exported = 0;
    for (const Candidate &c : candidates) {
      if (reviewState(c) != "approved")
        continue;
      std::string text;
      if (c.record.value("kind", "") == "reuse" &&
          agent::readText(c.dir + "/registry-entry.json", text)) {
        Json entry = Json::parse(text, nullptr, false);
        if (entry.is_discarded())
          continue;
        entry["approved"] = {{"candidate", c.id}, {"by", c.review.value("by", "")},
                             {"sha256", c.review.value("sha256", "")}};
        bool replaced = false;
        for (Json &e : out["ops"])
          if (e.value("id", "") == entry.value("id", "")) {
            e = entry;
            replaced = true;
          }
        if (!replaced)
          out["ops"].push_back(entry);
      } else {
        llvm::SmallString<256> src(c.dir + "/" + sourceFile(c));
        llvm::sys::fs::make_absolute(src);
        generated.push_back({{"candidate", c.id}, {"op", c.record.value("op", "")},
                             {"source", std::string(src)}, {"by", c.review.value("by", "")},
                             {"sha256", c.review.value("sha256", "")}});
        // Before the op's library entries: the registry matches the first.
        Json entry = generatedEntry(c, registry);
        Json &ops = out["ops"];
        auto first = std::find_if(ops.begin(), ops.end(), [&](const Json &e) {
          return e.value("op", "") == entry.value("op", "");
        });
        ops.insert(first, entry);
      }
      ++exported;
    }
    if (!generated.empty())
      out["generated_candidates"] = generated;
    if (!agent::writeText(exportPath, out.dump(2) + "\n", error)) {
      std::cerr << "adapt: error: " << error << "\n";
      return kExitBadInput;
    }
    std::cout << "exported " << exported << " approved candidate(s) into " << exportPath << "\n";
    return kExitOk;
  }

  int pending = 0;
  for (const Candidate &c : candidates) {
    if (!only.empty() && c.id != only)
      continue;
    show(c, registry);
    std::string state = reviewState(c);
    std::string status = c.record.value("status", "");
    if ((status == "proposed" || status == "validated") && state != "approved" &&
        state != "rejected")
      ++pending;
  }
  std::cout << candidates.size() << " candidate(s), " << pending
            << " awaiting a decision (adapt review " << dir << " --approve ID)\n";
  return kExitOk;
}

} // namespace adapt
