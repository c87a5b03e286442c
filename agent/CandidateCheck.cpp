//===- CandidateCheck.cpp - the op stage for LLM-written candidates ------===//
//
//   adapt-candidate-check --compile-flags | --cuda-compile-flags
//   adapt-candidate-check --cuda-available
//   adapt-candidate-check --tasks
//   adapt-candidate-check --task TASK --library CAND.so --out RESULT.json
//                         [--param key=value ...] [--seed N] [--device cpu|cuda]
//
// `adapt generate` runs this program as a child process (with time and
// memory limits) for every candidate an LLM wrote: it dlopens the candidate's
// shared object, calls its `adapt_candidate` entry on random inputs of several
// shapes (including shapes the prompt never showed), and compares forward and
// backward against a float64 reference that lives only in this executable (no
// exported symbols: the candidate can neither see nor call it). Inputs are
// poisoned views (NaN around them in memory), so a candidate that reads past
// its inputs or assumes contiguity produces NaN. The result is JSON.
//
// Tasks (one file each under agent/checks/, the shared harness in
// agent/checks/CheckHarness.h): moe_routing, rope, attention_core,
// glu_activation.
//
// CUDA candidates (`adapt generate --target cuda`) are compiled with nvcc and
// the flags --cuda-compile-flags prints, and run with --device cuda: their
// inputs (the same poisoned views) live on the GPU, the float64 reference
// stays on the CPU. --cuda-available exits 0 when this LibTorch sees a GPU.
//
// Exit codes: 0 every check passed, 4 a check failed, 2 bad usage or the
// library could not be loaded; --cuda-available: 0 yes, 1 no.
//
//===----------------------------------------------------------------------===//

#include "agent/checks/CheckHarness.h"

#include <dlfcn.h>

#include <fstream>
#include <iostream>

using namespace adapt::candidate_check;

namespace {

/// Every task this checker knows, by --task name.
std::vector<TaskSpec> allTasks() {
  return {routingTask(), ropeTask(), attentionCoreTask(), gluActivationTask()};
}

int usage(const std::string &message) {
  std::string names;
  for (const TaskSpec &t : allTasks())
    names += (names.empty() ? "" : "|") + t.name;
  std::cerr << "adapt-candidate-check: " << message << "\nusage: adapt-candidate-check --task "
            << names << " --library SO --out JSON [--param key=value ...] [--seed N]\n";
  return 2;
}

void writeFailure(const std::string &out, const std::string &task, const std::string &reason) {
  std::ofstream(out) << "{\"status\": \"failed\", \"task\": \"" << jsonEscape(task)
                     << "\", \"reason\": \"" << jsonEscape(reason) << "\", \"checks\": []}\n";
}

} // namespace

int main(int argc, char **argv) {
  std::string task, library, out, deviceName = "cpu";
  uint64_t seed = 1234;
  Params params;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--compile-flags") {
      std::cout << ADAPT_CANDIDATE_COMPILE_FLAGS << "\n";
      return 0;
    } else if (arg == "--cuda-compile-flags") {
      std::cout << ADAPT_CANDIDATE_CUDA_COMPILE_FLAGS << "\n";
      return 0;
    } else if (arg == "--cuda-available") {
      return torch::cuda::is_available() ? 0 : 1;
    } else if (arg == "--device") {
      std::string v = next();
      if (v != "cpu" && v != "cuda")
        return usage("--device expects cpu or cuda, found \"" + v + "\"");
      deviceName = v;
    } else if (arg == "--tasks") {
      for (const TaskSpec &t : allTasks())
        std::cout << t.name << "\n";
      return 0;
    } else if (arg == "--task") {
      task = next();
    } else if (arg == "--library") {
      library = next();
    } else if (arg == "--out") {
      out = next();
    } else if (arg == "--seed") {
      std::string v = next();
      char *end = nullptr;
      seed = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end)
        return usage("--seed expects an integer, found \"" + v + "\"");
    } else if (arg == "--param") {
      std::string kv = next();
      size_t eq = kv.find('=');
      char *end = nullptr;
      double value = eq == std::string::npos ? 0 : std::strtod(kv.c_str() + eq + 1, &end);
      if (eq == std::string::npos || eq == 0 || end == kv.c_str() + eq + 1 || *end)
        return usage("--param expects key=number, found \"" + kv + "\"");
      params[kv.substr(0, eq)] = value;
    } else {
      return usage("unknown argument " + arg);
    }
  }
  const TaskSpec *spec = nullptr;
  std::vector<TaskSpec> tasks = allTasks();
  for (const TaskSpec &t : tasks)
    if (t.name == task)
      spec = &t;
  if (!spec)
    return usage(task.empty() ? "--task is required" : "unknown task \"" + task + "\"");
  if (library.empty() || out.empty())
    return usage("--library and --out are required");
  if (deviceName == "cuda" && !torch::cuda::is_available())
    return usage("--device cuda: this LibTorch sees no CUDA device");
  torch::Device device = deviceName == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  if (std::string missing = spec->missingParams(params); !missing.empty())
    return usage("task " + task + ": " + missing);
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    writeFailure(out, task, std::string("cannot load the candidate: ") + dlerror());
    return 4;
  }
  using Entry = void *(*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "adapt_candidate_entry"));
  if (!entry) {
    writeFailure(out, task, "the candidate defines no adapt_candidate");
    return 4;
  }
  auto candidate = reinterpret_cast<CandidateFn>(entry());
  TaskOutcome outcome = runTask(candidate, *spec, params, seed, device);
  double speedup =
      outcome.candidateSeconds > 0 && !outcome.baselineFailed
          ? outcome.baselineSeconds / outcome.candidateSeconds
          : 0;
  std::ofstream os(out);
  os << "{\"status\": \"" << (outcome.passed ? "passed" : "failed") << "\", \"task\": \"" << task
     << "\", \"device\": \"" << deviceName << "\", \"speedup_over_composite\": " << speedup
     << ", \"candidate_seconds\": " << outcome.candidateSeconds
     << ", \"baseline_seconds\": " << outcome.baselineSeconds << ", \"checks\": [";
  for (size_t i = 0; i < outcome.checks.size(); ++i)
    os << (i ? ", " : "") << outcome.checks[i];
  os << "]}\n";
  return outcome.passed ? 0 : 4;
}
