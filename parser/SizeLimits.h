//===- SizeLimits.h - upper bounds on a config's counts and widths -*- C++ -*-===//
//
// A config is untrusted input: `num_experts: 1e12` or `hidden_size: 3e9` would
// make the manifest check allocate without bound or overflow parameter
// counts. Every count and width a model spec carries has an upper bound that
// no released model approaches (the largest of each in ../shared/models, and
// the mission's 2.8T target, are at least 8x below), checked right after the
// config is read, so later stages can multiply them in int64 without
// overflow. docs/gaps-schema.md#size-limits lists them.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_SIZELIMITS_H
#define ADAPT_PARSER_SIZELIMITS_H

#include "parser/InputError.h"
#include "parser/ModelSpec.h"

#include <cstdint>
#include <optional>

namespace adapt {

/// One bound: the config key it applies to (as reported) and its maximum.
struct SizeLimit {
  const char *key;
  int64_t maximum;
};

/// The bounds, in the order they are checked (docs list this table).
extern const SizeLimit kSizeLimits[];
extern const size_t kSizeLimitCount;

/// The first value of \p spec beyond its bound, as an InputError naming the
/// config file, the key and the bound; nullopt when all are within.
std::optional<InputError> checkSizeLimits(const ModelSpec &spec);

} // namespace adapt

#endif // ADAPT_PARSER_SIZELIMITS_H
