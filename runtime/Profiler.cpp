//===- Profiler.cpp - where a training step's time goes -------------------===//
//
// Kineto events in, a breakdown by kind out. CPU operators are nested per
// thread (start, longest first) to get each one's self time and the nearest
// enclosing `adapt::` scope (RECORD_FUNCTION in the runtime: the loss, the
// router, the optimizer); a GPU kernel takes the kind of the operator that
// launched it (linked correlation id), else of its own name.
//
//===----------------------------------------------------------------------===//

#include "runtime/Profiler.h"

#include "runtime/FileSystem.h"
#include "runtime/Json.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_map>

namespace adapt::rt {

namespace {

namespace kineto = torch::autograd::profiler;
namespace profiler = torch::profiler::impl;

bool containsAny(const std::string &s, std::initializer_list<const char *> parts) {
  for (const char *p : parts)
    if (s.find(p) != std::string::npos)
      return true;
  return false;
}

std::string lower(std::string s) {
  for (char &c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// The kind an `adapt::` scope name stands for, or "".
std::string scopeKind(const std::string &scope) {
  if (scope == "adapt::lm_head_loss")
    return "LM head + loss";
  if (scope == "adapt::optimizer")
    return "optimizer";
  if (scope == "adapt::moe.route" || scope == "adapt::moe.permute")
    return "router, top-k, permute";
  return "";
}

/// How many operators the markdown breakdown lists.
constexpr size_t kTopOperators = 20;

/// One CPU operator as the breakdown needs it.
struct CpuOp {
  std::string name, scope;
  std::vector<std::vector<int64_t>> shapes;
  uint64_t start = 0, end = 0, thread = 0, correlation = 0;
  double self = 0.0; ///< Seconds not spent in nested operators.
};

} // namespace

const std::vector<std::string> &profileKinds() {
  static const std::vector<std::string> kinds = {
      "attention core",         "dense GEMMs (projections, dense MLPs)", "LoRA GEMMs",
      "grouped expert GEMMs",   "router, top-k, permute", "norms, activations, elementwise",
      "LM head + loss",         "optimizer",              "copies, casts",
      "collectives",            "idle (no kernel running)"};
  return kinds;
}

std::string profileKind(const std::string &op, const std::vector<std::vector<int64_t>> &shapes,
                        const std::string &kernel, int64_t loraRank, int64_t vocab) {
  const std::string s = lower(op.empty() ? kernel : op);
  const std::string k = lower(kernel);
  // The token mixers' own kernels (runtime/cuda), by their names: the delta
  // rule's (GDN, lightning, Kimi's state pass), Kimi's, the DSA indexer's and
  // sparse MLA's (its key-gradient scatter too, which "scatter" below would
  // count as routing). Without this they fell to elementwise.
  if (containsAny(k, {"deltarule", "kimi", "perchannelscores", "indexerscores", "fusedindexer", "sparselatent",
                      "sparsekeyscatter"}))
    return "attention core";
  if (containsAny(s, {"scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "fmha"}) ||
      containsAny(k, {"flash", "fmha", "attention"}))
    return "attention core";
  if (containsAny(s, {"grouped_mm", "groupedgemm"}) || containsAny(k, {"grouped"}))
    return "grouped expert GEMMs";
  if (containsAny(s, {"nccl", "gloo", "c10d", "allreduce", "all_reduce", "alltoall", "all_to_all", "broadcast_"}))
    return "collectives";
  const bool gemm = s == "aten::mm" || s == "aten::addmm" || s == "aten::bmm" || s == "aten::matmul" ||
                    s == "aten::linear" || s == "aten::baddbmm" ||
                    (op.empty() && containsAny(k, {"gemm", "cutlass", "xmma", "nvjet"}));
  if (gemm) {
    for (const std::vector<int64_t> &shape : shapes)
      for (int64_t d : shape) {
        if (vocab > 0 && d == vocab)
          return "LM head + loss";
      }
    for (const std::vector<int64_t> &shape : shapes)
      for (int64_t d : shape)
        if (loraRank > 0 && d == loraRank)
          return "LoRA GEMMs";
    return "dense GEMMs (projections, dense MLPs)";
  }
  if (containsAny(s, {"logsumexp", "cross_entropy", "nll_loss", "log_softmax"}))
    return "LM head + loss";
  if (containsAny(s, {"topk", "sort", "index_select", "index_add", "scatter", "gather", "bincount", "histc",
                      "cumsum", "searchsorted", "nonzero", "repeat_interleave", "index_put", "aten::index",
                      "one_hot"}))
    return "router, top-k, permute";
  if (containsAny(s, {"_foreach", "adam", "multi_tensor"}))
    return "optimizer";
  if (containsAny(s, {"copy_", "_to_copy", "aten::to", "contiguous", "clone", "aten::cat", "memcpy", "memset",
                      "fill_", "zero_"}))
    return "copies, casts";
  return "norms, activations, elementwise";
}

std::string ProfileBreakdown::markdown() const {
  double total = 0.0;
  for (const auto &[kind, s] : seconds)
    total += s;
  char line[256];
  std::string md = std::string("| kind | ms per step | share |\n|---|---:|---:|\n");
  for (const std::string &kind : profileKinds()) {
    auto it = seconds.find(kind);
    if (it == seconds.end())
      continue;
    std::snprintf(line, sizeof(line), "| %s | %.2f | %.1f %% |\n", kind.c_str(),
                  1e3 * it->second / double(std::max<int64_t>(steps, 1)), total > 0 ? 100.0 * it->second / total : 0.0);
    md += line;
  }
  std::snprintf(line, sizeof(line), "| **%s** | **%.2f** | |\n",
                device ? "GPU time (kernels + idle)" : "CPU operator self time", 1e3 * total / double(std::max<int64_t>(steps, 1)));
  md += line;
  std::snprintf(line, sizeof(line), "\nWall time per step: %.2f ms over %lld profiled steps.\n",
                1e3 * span / double(std::max<int64_t>(steps, 1)), (long long)steps);
  md += line;
  std::vector<std::pair<double, std::pair<std::string, std::string>>> top;
  for (const auto &[key, secs] : operators)
    top.push_back({secs, key});
  std::sort(top.rbegin(), top.rend());
  if (top.size() > kTopOperators)
    top.resize(kTopOperators);
  md += "\nThe operators that took the most time:\n\n| operator | counted as | ms per step |\n|---|---|---:|\n";
  for (const auto &[secs, key] : top) {
    std::snprintf(line, sizeof(line), "| `%s` | %s | %.2f |\n", key.first.substr(0, 120).c_str(),
                  key.second.c_str(), 1e3 * secs / double(std::max<int64_t>(steps, 1)));
    md += line;
  }
  return md;
}

std::string ProfileBreakdown::json() const {
  JsonValue root = JsonValue::object();
  root.set("steps", steps);
  root.set("time", device ? "gpu_kernels" : "cpu_operator_self");
  root.set("wall_s_per_step", span / double(std::max<int64_t>(steps, 1)));
  JsonValue kinds = JsonValue::object();
  for (const std::string &kind : profileKinds())
    if (auto it = seconds.find(kind); it != seconds.end())
      kinds.set(kind, it->second / double(std::max<int64_t>(steps, 1)));
  root.set("seconds_per_step", std::move(kinds));
  JsonValue ops = JsonValue::object(); // operator -> seconds per step, all kinds together
  std::map<std::string, double> byName;
  for (const auto &[key, secs] : operators)
    byName[key.first] += secs;
  for (const auto &[name, secs] : byName)
    ops.set(name, secs / double(std::max<int64_t>(steps, 1)));
  root.set("operator_seconds_per_step", std::move(ops));
  return root.dump() + "\n";
}

struct StepProfiler::State {
  std::string outDir;
  int64_t first, count, loraRank, vocab;
  bool cuda, running = false;
  std::chrono::steady_clock::time_point started;
};

StepProfiler::StepProfiler(std::string outDir, int64_t first, int64_t count, bool cuda, int64_t loraRank,
                           int64_t vocab)
    : state(new State{std::move(outDir), first, count, loraRank, vocab, cuda}) {}

StepProfiler::~StepProfiler() {
  if (state && state->running)
    kineto::disableProfiler();
}

void StepProfiler::beforeStep(int64_t index) {
  if (state->count <= 0 || index != state->first || state->running)
    return;
  profiler::ProfilerConfig config(profiler::ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<profiler::ActivityType> activities = {profiler::ActivityType::CPU};
  if (state->cuda)
    activities.insert(profiler::ActivityType::CUDA);
  kineto::prepareProfiler(config, activities);
  if (state->cuda)
    torch::cuda::synchronize();
  kineto::enableProfiler(config, activities);
  state->running = true;
  state->started = std::chrono::steady_clock::now();
}

bool StepProfiler::afterStep(int64_t index) {
  if (!state->running || index != state->first + state->count - 1)
    return false;
  if (state->cuda)
    torch::cuda::synchronize();
  ProfileBreakdown b;
  b.span = std::chrono::duration<double>(std::chrono::steady_clock::now() - state->started).count();
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  state->running = false;
  b.steps = state->count;
  b.device = state->cuda;

  // CPU operators: self time and enclosing adapt:: scope, per thread.
  std::vector<CpuOp> ops;
  struct Kernel { std::string name; uint64_t start, end, linked; };
  std::vector<Kernel> kernels;
  for (const kineto::KinetoEvent &e : result->events()) {
    if (e.deviceType() == c10::DeviceType::CUDA) {
      kernels.push_back({e.name(), e.startNs(), e.endNs(), e.linkedCorrelationId()});
      continue;
    }
    CpuOp op;
    op.name = e.name();
    op.start = e.startNs(), op.end = e.endNs(), op.thread = e.startThreadId();
    op.correlation = e.correlationId();
    if (e.hasShapes())
      op.shapes.assign(e.shapes().begin(), e.shapes().end());
    ops.push_back(std::move(op));
  }
  std::sort(ops.begin(), ops.end(), [](const CpuOp &a, const CpuOp &b) {
    return a.thread != b.thread ? a.thread < b.thread : a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  std::vector<size_t> stack;
  for (size_t i = 0; i < ops.size(); ++i) {
    while (!stack.empty() && (ops[stack.back()].thread != ops[i].thread || ops[stack.back()].end <= ops[i].start))
      stack.pop_back();
    ops[i].self = double(ops[i].end - ops[i].start) * 1e-9;
    if (!stack.empty()) {
      CpuOp &parent = ops[stack.back()];
      parent.self -= double(ops[i].end - ops[i].start) * 1e-9;
      ops[i].scope = parent.name.rfind("adapt::", 0) == 0 ? parent.name : parent.scope;
    }
    stack.push_back(i);
  }
  auto kindOf = [&](const CpuOp &op, const std::string &kernel) {
    std::string k = scopeKind(op.scope);
    if (op.name.rfind("adapt::", 0) == 0)
      k = scopeKind(op.name);
    return k.empty() ? profileKind(op.name, op.shapes, kernel, state->loraRank, state->vocab) : k;
  };
  if (!state->cuda) {
    for (const CpuOp &op : ops)
      if (op.self > 0) {
        const std::string kind = kindOf(op, "");
        b.seconds[kind] += op.self;
        b.operators[{op.name, kind}] += op.self;
      }
  } else {
    std::unordered_map<uint64_t, const CpuOp *> byCorrelation;
    for (const CpuOp &op : ops)
      if (op.correlation != 0)
        byCorrelation[op.correlation] = &op;
    std::sort(kernels.begin(), kernels.end(), [](const Kernel &a, const Kernel &b) { return a.start < b.start; });
    double busy = 0.0;
    uint64_t coveredUntil = 0;
    for (const Kernel &k : kernels) {
      auto it = byCorrelation.find(k.linked);
      const std::string kind = it != byCorrelation.end() ? kindOf(*it->second, k.name)
                                                         : profileKind("", {}, k.name, state->loraRank, state->vocab);
      b.seconds[kind] += double(k.end - k.start) * 1e-9;
      b.operators[{it != byCorrelation.end() ? it->second->name : k.name, kind}] += double(k.end - k.start) * 1e-9;
      const uint64_t from = std::max(k.start, coveredUntil);
      if (k.end > from)
        busy += double(k.end - from) * 1e-9;
      coveredUntil = std::max(coveredUntil, k.end);
    }
    b.seconds["idle (no kernel running)"] = std::max(0.0, b.span - busy);
  }

  const std::string dir = joinPath(state->outDir, "profile");
  createDirectories(dir);
  result->save(joinPath(dir, "trace.json"));
  writeFileAtomic(joinPath(dir, "breakdown.md"),
                "# Profile of " + std::to_string(b.steps) + " training steps\n\n" + b.markdown());
  writeFileAtomic(joinPath(dir, "breakdown.json"), b.json());
  std::fprintf(stderr, "\nprofile of steps %lld-%lld (%s):\n%s%s\n", (long long)(state->first + 1),
               (long long)(state->first + state->count), b.device ? "GPU kernel time" : "CPU operator self time",
               b.markdown().c_str(), ("trace: " + joinPath(dir, "trace.json")).c_str());
  return true;
}

} // namespace adapt::rt
