//===- Margins.h - numerical bounds grounded in measured fp32 rounding -*- C++ -*-===//
//
// Every numerical bound in the runtime's tests says what it rests on
// (docs/validation.md#numerical-bounds). Two kinds:
//  - grounded live: the same computation in float64 gives the fp32 rounding
//    of this very input (fp32Rounding); the bound is a stated multiple of it;
//  - fixed, with the measured error and the margin written beside it.
// ADAPT_PRINT_MARGINS=1 prints "margin: WHAT error E bound B (Nx)" for each
// check, which is how the table in docs/validation.md was measured.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TESTS_MARGINS_H
#define ADAPT_RUNTIME_TESTS_MARGINS_H

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace adapt::rt::test {

/// |a - b| / |b| (Frobenius norms, in float64).
inline double relError(const torch::Tensor &a, const torch::Tensor &b) {
  torch::Tensor x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  return ((x - y).norm() / y.norm().clamp_min(1e-300)).item<double>();
}

/// Expects \p error < \p bound and, with ADAPT_PRINT_MARGINS set, prints both.
inline void expectWithin(const std::string &what, double error, double bound) {
  if (std::getenv("ADAPT_PRINT_MARGINS"))
    std::printf("margin: %-48s error %.3g bound %.3g (%.0fx)\n", what.c_str(), error, bound,
                error > 0 ? bound / error : INFINITY);
  EXPECT_LT(error, bound) << what;
}

} // namespace adapt::rt::test

#endif // ADAPT_RUNTIME_TESTS_MARGINS_H
