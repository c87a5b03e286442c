//===- OpRegistry.h - the operator library's registry -----------*- C++ -*-===//
//
// runtime/registry/ops.json is the one list of op variants the runtime
// provides (or plans): nothing else keeps a second list. It is compiled into
// the binary and can be overridden with --registry for development.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PASSES_OPREGISTRY_H
#define ADAPT_PASSES_OPREGISTRY_H

#include "parser/InputError.h"

#include <map>
#include <string>
#include <vector>

namespace adapt {

/// One op variant of the library.
struct RegistryEntry {
  std::string id;  ///< "attention.gqa"
  std::string op;  ///< "adapt.attention"
  std::map<std::string, std::vector<std::string>> match; ///< feature → allowed
  bool forward = false;
  bool backward = false;
  std::vector<std::string> dtypes, devices, loraTargets, parallel;
  /// implemented|planned|excluded (deliberately not run in training).
  std::string status;
  std::string tracking; ///< where the work is tracked
  std::string note;     ///< what the entry covers; for excluded: why
  /// An approved generated operator (`adapt review --export`): the source
  /// file, its SHA-256 as approved, the op-stage task it passed, who approved
  /// it. Empty source: the library's own implementation.
  struct Generated {
    std::string candidate, task, source, sha256, approvedBy;
    std::string mac; ///< HMAC of the approval (agent/ReviewKey.h), checked by adapt build.
  } generated;
  /// Whether the runtime really runs this entry: only `implemented` and
  /// `validated` entries do, whatever their forward/backward flags say. The
  /// gap analysis and `adapt build` both decide support through this.
  bool runnable() const { return status == "implemented" || status == "validated"; }
  bool runsForward() const { return runnable() && forward; }
  bool runsBackward() const { return runnable() && backward; }
};

/// The registry.
struct OpRegistry {
  std::vector<RegistryEntry> entries;
  /// The first entry for \p op whose constraints admit all \p features, or
  /// null; \p nearMiss gets the closest entry's first failing feature.
  /// The entry with id \p id (e.g. a gap's registry_entry), or null.
  const RegistryEntry *find(const std::string &id) const {
    for (const RegistryEntry &e : entries)
      if (!id.empty() && e.id == id)
        return &e;
    return nullptr;
  }
  const RegistryEntry *match(const std::string &op,
                             const std::map<std::string, std::string> &features,
                             std::string &nearMiss) const;
};

/// Parses registry JSON.
Result<OpRegistry> parseOpRegistry(const std::string &json,
                                   const std::string &fileForErrors);
/// The registry compiled into this binary.
const OpRegistry &builtinOpRegistry();
/// builtinOpRegistry()'s JSON text, runtime/registry/ops.json as built in
/// (`generate` and `review` read entries the parsed form does not keep).
const char *builtinOpRegistryText();
/// Reads a registry file (--registry).
Result<OpRegistry> readOpRegistry(const std::string &path);

} // namespace adapt

#endif // ADAPT_PASSES_OPREGISTRY_H
