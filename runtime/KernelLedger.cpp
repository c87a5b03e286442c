//===- KernelLedger.cpp - which calls reached the CUDA kernels ------------===//

#include "runtime/KernelLedger.h"

#include "runtime/Json.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace adapt::rt {

namespace {

/// The counts by site. Autograd's backward runs on its own thread per
/// device, so the map is guarded; a site is asked a few times per layer and
/// step, far below the cost of the kernels it launches.
struct Ledger {
  std::mutex lock;
  std::map<std::string, KernelTally> sites;
};

Ledger &ledger() {
  static Ledger instance;
  return instance;
}

} // namespace

bool chooseKernel(const char *site, const at::Tensor &x, bool enabled, bool takes) {
  if (x.defined() && !x.is_cpu()) { // the GPU (and meta tensors, for tests)
    Ledger &l = ledger();
    std::lock_guard<std::mutex> guard(l.lock);
    KernelTally &t = l.sites[site];
    t.site = site;
    if (!enabled) {
      ++t.switchedOff;
    } else if (!takes) {
      if (t.refused++ == 0) // what the kernel refused, for the warning
        t.firstRefused = std::string(c10::toString(x.scalar_type())) + " " + c10::str(x.sizes()) + " strides " +
                         c10::str(x.strides());
    } else {
      ++t.kernel;
    }
  }
  return enabled && takes;
}

std::vector<KernelTally> kernelTallies() {
  Ledger &l = ledger();
  std::lock_guard<std::mutex> guard(l.lock);
  std::vector<KernelTally> out;
  for (const auto &entry : l.sites)
    out.push_back(entry.second);
  return out;
}

void resetKernelLedger() {
  Ledger &l = ledger();
  std::lock_guard<std::mutex> guard(l.lock);
  l.sites.clear();
}

std::string kernelLedgerLine(const std::vector<KernelTally> &tallies) {
  if (tallies.empty())
    return "no guarded kernel site was called";
  std::string line;
  for (const KernelTally &t : tallies) {
    if (!line.empty())
      line += "; ";
    line += t.site + ": " + std::to_string(t.kernel) + " kernel";
    if (t.switchedOff > 0)
      line += ", " + std::to_string(t.switchedOff) + " off";
    if (t.refused > 0)
      line += ", " + std::to_string(t.refused) + " refused (first: " + t.firstRefused + ")";
  }
  return line;
}

std::string kernelLedgerJson(const std::vector<KernelTally> &tallies) {
  JsonValue sites = JsonValue::object({});
  for (const KernelTally &t : tallies) {
    JsonValue site = JsonValue::object({{"kernel", t.kernel}, {"switched_off", t.switchedOff}, {"refused", t.refused}});
    if (t.refused > 0)
      site.set("first_refused", t.firstRefused);
    sites.set(t.site, std::move(site));
  }
  return JsonValue::object({{"built_in", cudaKernelsBuiltIn()}, {"sites", std::move(sites)}}).dump(2) + "\n";
}

bool cudaKernelsBuiltIn() {
#ifdef ADAPT_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

} // namespace adapt::rt
