//===- CandidateCheck.cpp - the op stage for LLM-written candidates ------===//
//
//   adapt-candidate-check --compile-flags | --cuda-compile-flags
//   adapt-candidate-check --cuda-available
//   adapt-candidate-check --tasks
//   adapt-candidate-check --task TASK --library CAND.so --emit OUTPUTS.safetensors
//                         [--param key=value ...] [--seed N] [--device cpu|cuda]
//   adapt-candidate-check --task TASK --judge OUTPUTS.safetensors --out RESULT.json
//                         [--param key=value ...] [--seed N] [--device cpu|cuda]
//
// `adapt generate` runs this program twice for every candidate an LLM wrote.
// --emit, inside the candidate sandbox (agent/Sandbox.h): dlopens the
// candidate's shared object, calls its `adapt_candidate` entry on random
// inputs of several shapes (including shapes the prompt never showed), as
// poisoned views (NaN around them in memory, so reading past an input or
// assuming contiguity shows), forward and backward, and writes only the
// tensors it computed and the timings. --judge, outside the sandbox and
// without ever loading the candidate: rebuilds the same inputs from the
// seed, computes the float64 reference, reads the emitted tensors with the
// hardened safetensors reader and writes the verdict. The candidate can
// neither see the reference nor write the verdict.
//
// Tasks (one file each under agent/checks/, the shared harness in
// agent/checks/CheckHarness.h): moe_routing, rope, attention_core,
// glu_activation.
//
// CUDA candidates (`adapt generate --target cuda`) are compiled with nvcc and
// the flags --cuda-compile-flags prints, and emitted with --device cuda: their
// inputs (the same poisoned views) live on the GPU; the float64 reference
// stays on the CPU. --cuda-available exits 0 when this LibTorch sees a GPU.
//
// Exit codes: --emit 0 when the outputs were written, 4 when the library
// could not be loaded; --judge 0 every check passed, 4 a check failed (or
// the outputs are missing or unreadable); 2 bad usage; --cuda-available: 0
// yes, 1 no.
//
//===----------------------------------------------------------------------===//

#include "agent/checks/CheckHarness.h"
#include "runtime/CommandLine.h"
#include "runtime/Errors.h"
#include "runtime/SafetensorsIO.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cmath>
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

/// --emit: the candidate's outputs and gradients for every case, and the
/// timings (candidate, baseline, baseline failed), into \p file.
int emitOutputs(const TaskSpec &spec, const std::vector<CheckCase> &cases, const std::string &library,
                const std::string &file, uint64_t seed, const torch::Device &device) {
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::cerr << "cannot load the candidate: " << dlerror() << "\n";
    return 4;
  }
  using Entry = void *(*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "adapt_candidate_entry"));
  if (!entry) {
    std::cerr << "the candidate defines no adapt_candidate\n";
    return 4;
  }
  auto candidate = reinterpret_cast<CandidateFn>(entry());
  Emitted emitted;
  TaskOutcome timing;
  for (size_t i = 0; i < cases.size(); ++i)
    emitCase(candidate, spec, cases[i], i, caseSeed(seed, i), emitted, timing, device);
  std::vector<std::pair<std::string, torch::Tensor>> tensors(emitted.begin(), emitted.end());
  tensors.push_back({"timing", torch::tensor({timing.candidateSeconds, timing.baselineSeconds,
                                              timing.baselineFailed ? 1.0 : 0.0}, torch::kFloat64)});
  adapt::rt::writeSafetensors(file, tensors);
  return 0;
}

/// --judge: the verdict on \p file (what --emit wrote, untrusted) into
/// \p out, never loading the candidate.
int judgeOutputs(const TaskSpec &spec, const std::vector<CheckCase> &cases, const std::string &file,
                 const std::string &out, const std::string &task, const std::string &deviceName, uint64_t seed,
                 const torch::Device &device) {
  Emitted emitted;
  struct stat st;
  std::string unreadable;
  if (::lstat(file.c_str(), &st) != 0)
    unreadable = "the candidate produced no outputs (it crashed, exited early or timed out)";
  else if (!S_ISREG(st.st_mode))
    unreadable = "the candidate's outputs are not a regular file";
  else
    try {
      adapt::rt::SafetensorsFile f(file);
      for (const adapt::rt::TensorInfo &t : f.tensors())
        emitted[t.name] = f.view(t.name).clone();
    } catch (const std::exception &e) {
      unreadable = std::string("the candidate's outputs are unreadable: ") + e.what();
    }
  if (!unreadable.empty()) {
    writeFailure(out, task, unreadable);
    return 4;
  }
  TaskOutcome outcome;
  for (size_t i = 0; i < cases.size(); ++i)
    judgeCase(spec, cases[i], i, caseSeed(seed, i), emitted, outcome, device);
  double candidateSeconds = 0, baselineSeconds = 0;
  bool baselineFailed = true;
  if (auto it = emitted.find("timing"); it != emitted.end() && it->second.numel() == 3 &&
                                        it->second.is_floating_point()) {
    torch::Tensor t = it->second.to(torch::kFloat64);
    candidateSeconds = std::max(0.0, t[0].item<double>());
    baselineSeconds = std::max(0.0, t[1].item<double>());
    baselineFailed = t[2].item<double>() != 0;
  }
  // Timings come from the sandbox: they only decide a review flag.
  double speedup = candidateSeconds > 0 && !baselineFailed ? baselineSeconds / candidateSeconds : 0;
  std::ofstream os(out);
  os << "{\"status\": \"" << (outcome.passed ? "passed" : "failed") << "\", \"task\": \"" << task
     << "\", \"device\": \"" << deviceName << "\", \"speedup_over_composite\": " << speedup
     << ", \"candidate_seconds\": " << candidateSeconds << ", \"baseline_seconds\": " << baselineSeconds
     << ", \"checks\": [";
  for (size_t i = 0; i < outcome.checks.size(); ++i)
    os << (i ? ", " : "") << outcome.checks[i];
  os << "]}\n";
  return outcome.passed ? 0 : 4;
}

} // namespace

int main(int argc, char **argv) {
  std::string task, library, out, emit, judge, deviceName;
  uint64_t seed = 0;
  Params params;
  try {
    using namespace adapt::rt;
    const ParsedFlags flags =
        parseFlags(argc, argv,
                   {{"--device", "--task", "--library", "--out", "--emit", "--judge", "--seed", "--param"},
                    {"--compile-flags", "--cuda-compile-flags", "--cuda-available", "--tasks"},
                    {"--param"}});
    if (flags.has("--compile-flags")) {
      std::cout << ADAPT_CANDIDATE_COMPILE_FLAGS << "\n";
      return 0;
    }
    if (flags.has("--cuda-compile-flags")) {
      std::cout << ADAPT_CANDIDATE_CUDA_COMPILE_FLAGS << "\n";
      return 0;
    }
    if (flags.has("--cuda-available"))
      return torch::cuda::is_available() ? 0 : 1;
    if (flags.has("--tasks")) {
      for (const TaskSpec &t : allTasks())
        std::cout << t.name << "\n";
      return 0;
    }
    deviceName = flags.choice("--device", "cpu", {"cpu", "cuda"});
    task = flags.text("--task");
    library = flags.text("--library");
    out = flags.text("--out");
    emit = flags.text("--emit");
    judge = flags.text("--judge");
    seed = uint64_t(flags.integer("--seed", 1234, 0));
    if (flags.has("--param"))
      for (const std::string &kv : flags.values.at("--param")) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0)
          return usage("--param expects key=number, found \"" + kv + "\"");
        params[kv.substr(0, eq)] = parseNumber("--param " + kv.substr(0, eq), kv.substr(eq + 1), -HUGE_VAL);
      }
  } catch (const adapt::rt::RuntimeError &e) {
    return usage(e.what());
  }
  const TaskSpec *spec = nullptr;
  std::vector<TaskSpec> tasks = allTasks();
  for (const TaskSpec &t : tasks)
    if (t.name == task)
      spec = &t;
  if (!spec)
    return usage(task.empty() ? "--task is required" : "unknown task \"" + task + "\"");
  if (emit.empty() == judge.empty())
    return usage("exactly one of --emit (with --library) and --judge (with --out) is required");
  if ((!emit.empty() && library.empty()) || (!judge.empty() && out.empty()))
    return usage(emit.empty() ? "--judge needs --out" : "--emit needs --library");
  if (!emit.empty() && deviceName == "cuda" && !torch::cuda::is_available())
    return usage("--device cuda: this LibTorch sees no CUDA device");
  torch::Device device = deviceName == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  if (std::string missing = spec->missingParams(params); !missing.empty())
    return usage("task " + task + ": " + missing);
  std::vector<CheckCase> cases = spec->cases(params, seed);
  if (!emit.empty())
    return emitOutputs(*spec, cases, library, emit, seed, device);
  return judgeOutputs(*spec, cases, judge, out, task, deviceName, seed, device);
}
