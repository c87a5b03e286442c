//===- KernelLedger.h - which calls reached the CUDA kernels ----*- C++ -*-===//
//
// A CUDA kernel behind a shape, dtype or layout test falls back to the
// LibTorch composition without a word when the test says no. Session 42
// found that no Gated DeltaNet or Kimi layer of the model had ever reached
// its kernels (fp32 q/k, strided rows), and every benchmark of those layers
// had measured the composition. The ledger makes that visible: each guarded
// dispatch site asks chooseKernel, which counts, per site, the CUDA calls
// that ran the kernel, those whose kernel was switched off, and those the
// kernel refused. The trainer prints the first step's tally on a GPU, warns
// about refusals, and writes the run's tally to OUT/kernels.json, which the
// GPU benchmarks assert on.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_KERNELLEDGER_H
#define ADAPT_RUNTIME_KERNELLEDGER_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace adapt::rt {

/// One dispatch site's counts of calls on CUDA tensors since the last reset.
struct KernelTally {
  std::string site;       ///< e.g. "gated_delta_rule.train"
  int64_t kernel = 0;     ///< calls that ran the CUDA kernel
  int64_t switchedOff = 0; ///< calls whose kernel was off (its switch, or autograd needs it lacks)
  int64_t refused = 0;    ///< calls the kernel could not take (shape, dtype, layout)
  std::string firstRefused; ///< the first refused call's input: dtype, sizes and strides
};

/// Whether the site \p site runs its kernel: `enabled && takes`. Counts the
/// call when \p x is off the CPU (a CPU call has no kernel to miss).
/// \p site must be a string literal (it is kept by pointer).
bool chooseKernel(const char *site, const at::Tensor &x, bool enabled, bool takes);

/// The tallies, sorted by site name.
std::vector<KernelTally> kernelTallies();

/// Forgets every count (the trainer resets after its first step's line).
void resetKernelLedger();

/// One line for people: "site: N kernel[, N off][, N refused (first:
/// bfloat16 [2, 16, 200, 64] strides [...])]; ...", or
/// "no guarded kernel site was called" when the ledger is empty.
std::string kernelLedgerLine(const std::vector<KernelTally> &tallies);

/// The tallies as JSON: {"built_in": bool, "sites": {site: {"kernel": N,
/// "switched_off": N, "refused": N[, "first_refused": "..."]}}}.
std::string kernelLedgerJson(const std::vector<KernelTally> &tallies);

/// Whether this runtime was built with its CUDA kernels (nvcc found at
/// build time); without them every GPU op runs as LibTorch composition.
bool cudaKernelsBuiltIn();

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_KERNELLEDGER_H
