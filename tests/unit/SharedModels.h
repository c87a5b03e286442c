//===- SharedModels.h - where the unit tests find the shared models -*- C++ -*-===//
#ifndef ADAPT_TESTS_UNIT_SHAREDMODELS_H
#define ADAPT_TESTS_UNIT_SHAREDMODELS_H

#include <cstdlib>
#include <string>

#ifndef ADAPT_SOURCE_DIR
#error "compile with -DADAPT_SOURCE_DIR='\"/path/to/repo\"'"
#endif

namespace adapt {

/// The folder holding the shared model releases the real-model tests read:
/// $ADAPT_SHARED_MODELS, or ../shared/models next to the repository.
inline std::string sharedModelsDir() {
  if (const char *env = std::getenv("ADAPT_SHARED_MODELS"))
    return env;
  return std::string(ADAPT_SOURCE_DIR) + "/../shared/models";
}

} // namespace adapt

#endif // ADAPT_TESTS_UNIT_SHAREDMODELS_H
