//===- Switches.h - the CUDA kernels' environment switches -----*- C++ -*-===//
//
// Kernels written or changed without a GPU wait behind an opt-in switch until
// their op checks have run on one (docs/runtime.md lists them); checked ones
// keep an opt-out. Each kernel reads its switch once per process. Which
// calls reached a kernel is counted in runtime/KernelLedger.h.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_SWITCHES_H
#define ADAPT_RUNTIME_CUDA_SWITCHES_H

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace adapt::rt::cuda {

/// Whether the environment variable \p name says "1" (an opt-in switch).
inline bool switchedOn(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

/// Whether the environment variable \p name says "0" (an opt-out switch).
inline bool switchedOff(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

/// The environment variable \p name as one of \p allowed numbers, or
/// \p unset where it is not set; any other value stops with an error naming
/// the variable.
inline int switchedChoice(const char *name, std::initializer_list<int> allowed, int unset) {
  const char *v = std::getenv(name);
  if (v == nullptr)
    return unset;
  for (int a : allowed)
    if (std::to_string(a) == v)
      return a;
  std::string expected;
  for (int a : allowed)
    expected += (expected.empty() ? "" : " or ") + std::to_string(a);
  throw std::invalid_argument(std::string(name) + ": expected " + expected + ", found '" + v + "'");
}

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_SWITCHES_H
