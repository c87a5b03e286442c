//===- Profiler.h - where a training step's time goes -----------*- C++ -*-===//
//
// `train --profile N`: LibTorch's Kineto profiler over N steps (from the
// second step of the run, so one-time allocation and autotuning stay out),
// written as a Chrome trace (OUT/profile/trace.json, open in Perfetto or
// chrome://tracing) and a breakdown of the time by kind of work
// (OUT/profile/breakdown.md and .json, also printed). On CUDA the time is
// GPU kernel time, each kernel classified by the operator that launched it,
// plus the idle gaps between kernels; on the CPU it is operator self time.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_PROFILER_H
#define ADAPT_RUNTIME_PROFILER_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace adapt::rt {

/// The kinds a breakdown sorts time into, in report order.
const std::vector<std::string> &profileKinds();

/// The kind of one operator (or, with no operator, one kernel \p name):
/// GEMMs are told apart by their shapes (a dimension equal to \p loraRank is
/// LoRA, one equal to \p vocab the LM head), the rest by name.
std::string profileKind(const std::string &op, const std::vector<std::vector<int64_t>> &shapes,
                        const std::string &kernel, int64_t loraRank, int64_t vocab);

/// Seconds per kind over the profiled steps, and what they cover.
struct ProfileBreakdown {
  std::map<std::string, double> seconds; ///< kind -> seconds (all steps).
  /// (operator, kind) -> seconds: the launching operator for a kernel (else
  /// the kernel), with the kind it counted as there (one operator, such as
  /// aten::mul, can serve several kinds).
  std::map<std::pair<std::string, std::string>, double> operators;
  double span = 0.0;                     ///< Wall time of the profiled steps.
  int64_t steps = 0;
  bool device = false; ///< GPU kernel time (else CPU operator self time).
  /// Markdown tables: per kind, ms per step and share; then the operators
  /// that took the most time.
  std::string markdown() const;
  std::string json() const;
};

/// Profiles steps [first, first + count) of a run (0-based step indices).
class StepProfiler {
public:
  StepProfiler(std::string outDir, int64_t first, int64_t count, bool cuda, int64_t loraRank, int64_t vocab);
  ~StepProfiler();
  /// Call before step \p index runs; starts the profiler at the first one.
  void beforeStep(int64_t index);
  /// Call after step \p index; after the last one, stops, writes the trace
  /// and the breakdown, prints the table, and returns true.
  bool afterStep(int64_t index);

private:
  struct State;
  std::unique_ptr<State> state;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_PROFILER_H
