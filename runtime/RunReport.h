//===- RunReport.h - a run's curves as a page people look at -----*- C++ -*-===//
//
// OUT/metrics.jsonl is for programs; OUT/report.html is for people: the loss
// (and eval loss), gradient norm, learning rate, throughput and MFU curves,
// the expert load of the last step per MoE layer (and per expert-parallel
// rank) and over the run's steps, and, for parallel runs, the collectives'
// time per step and each rank's peak memory. One self-contained file (inline
// SVG, no scripts, no network; every chart's points also as a data-series
// attribute), rewritten by the trainer at every checkpoint, every eval and
// at the end. On a GPU it ends with the kernel ledger's table
// (OUT/kernels.json, runtime/KernelLedger.h).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_RUNREPORT_H
#define ADAPT_RUNTIME_RUNREPORT_H

#include <string>

namespace adapt::rt {

/// Writes OUT_DIR/report.html from OUT_DIR/metrics.jsonl (atomically; a
/// malformed line is skipped). Write failures throw RuntimeError (exit 6).
void writeRunReport(const std::string &outDir);

/// This process's peak memory so far, in GiB: host (resident set) and, on a
/// CUDA device, the caching allocator's peak (0 elsewhere).
double peakHostGiB();
double peakDeviceGiB(int deviceIndex);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_RUNREPORT_H
