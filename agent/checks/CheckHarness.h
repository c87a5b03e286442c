//===- CheckHarness.h - shared harness of adapt-candidate-check -*- C++ -*-===//
//
// What every op-stage task of `adapt-candidate-check` shares: the candidate's
// signature, poisoned input views, the forward + backward comparison of one
// test case against a float64 reference, the per-check JSON and the timing
// against a composite baseline. A task (agent/checks/<Task>Check.cpp) only
// supplies its test cases, its float64 reference (the plain definition,
// independent of runtime/ code) and a straightforward LibTorch composite used
// as the speed baseline. LibTorch only; no adapt includes.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_CHECKS_CHECKHARNESS_H
#define ADAPT_AGENT_CHECKS_CHECKHARNESS_H

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <map>
#include <string>
#include <vector>

namespace adapt::candidate_check {

/// Scalar parameters a candidate receives (e.g. top_k, theta, window).
using Params = std::map<std::string, double>;

/// The signature every candidate defines (see docs/agent.md).
using CandidateFn = torch::Tensor (*)(const std::vector<torch::Tensor> &, const Params &);

/// A reference or baseline: same inputs and params as the candidate.
using TensorFn = std::function<torch::Tensor(const std::vector<torch::Tensor> &, const Params &)>;

/// One input of a test case, in float64 (floating inputs) or int64.
struct CaseInput {
  std::string name;           ///< As the prompt names it, e.g. "logits".
  torch::Tensor value;        ///< float64 or int64 values.
  bool differentiable = true; ///< Gradient w.r.t. it is checked (floating only).
};

/// One test case: inputs, the full parameter map, a readable shape text.
struct CheckCase {
  std::string shape;      ///< e.g. "T=5 H=3 D=16"; "(unseen shape)" is appended when !shown.
  bool shown = false;     ///< The shape the prompt shows.
  std::vector<CaseInput> inputs;
  Params params;
};

/// An op-stage task: its cases (from the model's params), its reference and
/// its speed baseline.
struct TaskSpec {
  std::string name; ///< e.g. "rope" (the --task value).
  /// Builds the cases from the model-level params given on the command line.
  std::function<std::vector<CheckCase>(const Params &modelParams, uint64_t seed)> cases;
  TensorFn reference; ///< float64 plain definition (autograd gives its gradients).
  TensorFn baseline;  ///< float32 LibTorch composite, only timed.
  /// The model-level params the task needs but lacks ("" when complete):
  /// a bad invocation, reported as usage error rather than blamed on the
  /// candidate.
  std::function<std::string(const Params &modelParams)> missingParams =
      [](const Params &) { return std::string(); };
};

/// One case per shape of \p shapes, each with torch seeded by
/// \p seedOf(shape) first (so a case's inputs depend on the seed and its shape
/// alone) and shown in the prompt as the shape says; \p fill sets the rest
/// (shape text, params, inputs). Every task's case list is built this way.
template <typename Shapes, typename SeedFn, typename FillFn>
std::vector<CheckCase> casesOf(const Shapes &shapes, SeedFn seedOf, FillFn fill) {
  std::vector<CheckCase> cases;
  for (const auto &shape : shapes) {
    torch::manual_seed(seedOf(shape));
    CheckCase c;
    c.shown = shape.shownInPrompt;
    fill(shape, c);
    cases.push_back(std::move(c));
  }
  return cases;
}

/// \p model's params with \p defaults added for those the model does not set.
inline Params withDefaults(Params model, const Params &defaults) {
  for (const auto &[key, value] : defaults)
    model.emplace(key, value);
  return model;
}

/// The first of \p keys that \p p lacks, as an error text ("" when none).
inline std::string requireParams(const Params &p, std::initializer_list<const char *> keys,
                                 const std::string &why) {
  for (const char *key : keys)
    if (!p.count(key))
      return "--param " + std::string(key) + "=... is required (" + why + ")";
  return "";
}

/// The outcome of running a task's cases on a candidate.
struct TaskOutcome {
  bool passed = true;
  std::vector<std::string> checks; ///< One JSON object per case.
  double candidateSeconds = 0, baselineSeconds = 0;
  bool baselineFailed = false; ///< The baseline threw somewhere: no speed-up.
};

/// Relative tolerance of fp32 candidates against the float64 reference.
constexpr double kTolerance = 1e-5;

/// Escapes \p s for a JSON string literal.
inline std::string jsonEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out;
}

/// A view of \p values inside a poison-filled buffer with a non-unit stride
/// on the last dimension: floating buffers hold NaN, integer ones a huge
/// value, so a candidate that reads past its inputs or assumes contiguity
/// produces NaN or wrong numbers. Gradients flow back to \p values.
inline torch::Tensor poisoned(const torch::Tensor &values) {
  std::vector<int64_t> big(values.sizes().begin(), values.sizes().end());
  big.back() = big.back() * 2 + 3;
  torch::Tensor buffer = values.is_floating_point()
                             ? torch::full(big, std::nan(""), values.options().requires_grad(false))
                             : torch::full(big, int64_t(1) << 40, values.options());
  torch::Tensor view = buffer.narrow(-1, 1, values.size(-1) * 2).slice(-1, 0, c10::nullopt, 2);
  view.copy_(values);
  return view;
}

/// Max of |a - b| / (|b| + 1): relative for large values, absolute near 0.
inline double maxRelError(const torch::Tensor &a, const torch::Tensor &b) {
  if (a.numel() == 0)
    return 0;
  return ((a.to(torch::kFloat64) - b).abs() / (b.abs() + 1.0)).max().item<double>();
}

/// Waits for \p device's queued work (CUDA) so wall-clock timings are real.
inline void synchronize(const torch::Device &device) {
  if (device.is_cuda())
    torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
}

/// The check runs in two processes (docs/security.md#candidate-sandbox):
/// emitCase runs the candidate, inside the sandbox, and keeps only what it
/// computed: "<i>.out", "<i>.grad.<j>" per differentiable input j, or
/// "<i>.threw"/"<i>.device" as UTF-8 bytes. judgeCase, in a process that never
/// loads the candidate, rebuilds the same inputs from the seed, computes the
/// float64 reference and decides. A candidate can thus only hand over
/// numbers; it cannot reach the reference or write its own verdict.
using Emitted = std::map<std::string, torch::Tensor>;

/// \p text as a uint8 tensor (how strings travel in the emitted file).
inline torch::Tensor textTensor(const std::string &text) {
  torch::Tensor t = torch::empty({int64_t(text.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), text.data(), text.size());
  return t;
}
inline std::string tensorText(const torch::Tensor &t) {
  torch::Tensor c = t.to(torch::kUInt8).contiguous();
  return std::string(reinterpret_cast<const char *>(c.data_ptr<uint8_t>()), size_t(c.numel()));
}

/// The cotangent of case \p seed for an output of \p sizes: the same values
/// in both processes when the candidate's output has the reference's shape.
inline torch::Tensor upstreamOf(at::IntArrayRef sizes, uint64_t seed) {
  torch::manual_seed(seed + 7919);
  return torch::randn(sizes, torch::kFloat64);
}

/// Runs the candidate on case \p i (float32 poisoned views on \p device),
/// forward and backward, and times it and the composite baseline.
inline void emitCase(CandidateFn candidate, const TaskSpec &task, const CheckCase &c, size_t i, uint64_t seed,
                     Emitted &emitted, TaskOutcome &timing, const torch::Device &device = torch::kCPU) {
  const std::string key = std::to_string(i);
  try {
    std::vector<torch::Tensor> leaves, views, baselineInputs;
    bool anyGrad = false;
    for (const CaseInput &in : c.inputs) {
      bool grad = in.differentiable && in.value.is_floating_point();
      anyGrad |= grad;
      torch::Tensor leaf = in.value.is_floating_point() ? in.value.to(device, torch::kFloat32)
                                                        : in.value.to(device);
      if (grad)
        leaf.requires_grad_(true);
      leaves.push_back(leaf);
      views.push_back(poisoned(leaf));
      baselineInputs.push_back(leaf.detach());
    }
    synchronize(device);
    auto start = std::chrono::steady_clock::now();
    torch::Tensor out = candidate(views, c.params);
    synchronize(device);
    timing.candidateSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    start = std::chrono::steady_clock::now();
    try {
      // Timing only: the baseline's own faults never count against the candidate.
      torch::NoGradGuard noGrad;
      task.baseline(baselineInputs, c.params);
      synchronize(device);
      timing.baselineSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } catch (const std::exception &) {
      timing.baselineFailed = true;
    }
    if (!out.defined())
      return;
    emitted[key + ".device"] = textTensor(out.device().str());
    emitted[key + ".out"] = out.detach().cpu().contiguous();
    if (anyGrad && out.requires_grad() && out.is_floating_point()) {
      torch::Tensor up = upstreamOf(out.sizes(), seed);
      (out * up.to(out.device(), out.scalar_type())).sum().backward();
      for (size_t j = 0; j < leaves.size(); ++j)
        if (leaves[j].requires_grad() && leaves[j].grad().defined())
          emitted[key + ".grad." + std::to_string(j)] = leaves[j].grad().cpu().contiguous();
    }
  } catch (const std::exception &e) {
    emitted[key + ".threw"] = textTensor(std::string(e.what()).substr(0, 600));
  }
}

/// Decides case \p i from what the candidate emitted, against the float64
/// reference computed here; appends the case's JSON to \p outcome.
/// \p device: where the candidate ran (its output must be there).
inline void judgeCase(const TaskSpec &task, const CheckCase &c, size_t i, uint64_t seed, const Emitted &emitted,
                      TaskOutcome &outcome, const torch::Device &device = torch::kCPU) {
  const std::string key = std::to_string(i);
  auto find = [&](const std::string &suffix) {
    auto it = emitted.find(key + suffix);
    return it == emitted.end() ? torch::Tensor() : it->second;
  };
  std::string name = c.shape + (c.shown ? "" : " (unseen shape)");
  std::string status = "passed", detail;
  double fwdErr = 0, bwdErr = 0;
  try {
    std::vector<torch::Tensor> ref64Inputs;
    bool anyGrad = false;
    for (const CaseInput &in : c.inputs) {
      bool grad = in.differentiable && in.value.is_floating_point();
      anyGrad |= grad;
      ref64Inputs.push_back(in.value.clone().requires_grad_(grad));
    }
    torch::Tensor ref = task.reference(ref64Inputs, c.params);
    if (anyGrad)
      (ref * upstreamOf(ref.sizes(), seed)).sum().backward();
    torch::Tensor out = find(".out");
    if (torch::Tensor threw = find(".threw"); threw.defined()) {
      status = "failed";
      detail = "threw: " + tensorText(threw);
    } else if (!out.defined() || out.sizes() != ref.sizes()) {
      status = "failed";
      detail = "output shape " + (out.defined() ? c10::str(out.sizes()) : std::string("undefined")) +
               ", expected " + c10::str(ref.sizes());
    } else if (torch::Tensor where = find(".device"); !where.defined() || tensorText(where) != device.str()) {
      status = "failed";
      detail = "output is on " + (where.defined() ? tensorText(where) : std::string("?")) + ", expected " +
               device.str();
    } else if (!out.is_floating_point()) {
      status = "failed";
      detail = "output is not a floating tensor";
    } else if (!torch::isfinite(out).all().item<bool>()) {
      status = "failed";
      detail = "output has NaN/Inf (poisoned inputs read out of bounds or as contiguous?)";
    } else if ((fwdErr = maxRelError(out, ref.detach())) > kTolerance || std::isnan(fwdErr)) {
      status = "failed";
      detail = "forward differs from the reference (max rel error " + std::to_string(fwdErr) + ")";
    } else if (anyGrad) {
      bool any = false;
      for (size_t j = 0; j < ref64Inputs.size(); ++j)
        any |= find(".grad." + std::to_string(j)).defined();
      if (!any) {
        status = "failed";
        detail = "output does not depend differentiably on the inputs (no backward)";
      }
      for (size_t j = 0; j < ref64Inputs.size() && status == "passed"; ++j) {
        if (!ref64Inputs[j].requires_grad())
          continue;
        torch::Tensor g = find(".grad." + std::to_string(j)), want = ref64Inputs[j].grad();
        const std::string &input = c.inputs[j].name;
        if (!g.defined()) {
          status = "failed";
          detail = "no gradient reached input '" + input + "'";
          continue;
        }
        if (g.sizes() != want.sizes() || !g.is_floating_point()) {
          status = "failed";
          detail = "gradient w.r.t. '" + input + "' has shape " + c10::str(g.sizes());
          continue;
        }
        double e = maxRelError(g, want);
        bwdErr = std::max(bwdErr, std::isnan(e) ? 1e30 : e);
        if (!(e <= kTolerance)) {
          status = "failed";
          detail = "backward differs from the reference w.r.t. '" + input + "' (max rel error " +
                   std::to_string(e) + ")";
        }
      }
    }
  } catch (const std::exception &e) {
    status = "failed";
    detail = std::string("the check threw: ") + e.what();
    detail = detail.substr(0, 600);
  }
  outcome.passed &= status == "passed";
  std::ostringstream os;
  os << "{\"shape\": \"" << jsonEscape(name) << "\", \"status\": \"" << status
     << "\", \"forward_max_rel_error\": " << fwdErr << ", \"backward_max_rel_error\": " << bwdErr
     << ", \"detail\": \"" << jsonEscape(detail) << "\"}";
  outcome.checks.push_back(os.str());
}

/// The seed of case \p i of a run with \p seed.
inline uint64_t caseSeed(uint64_t seed, size_t i) { return seed + 101 * i; }

/// A parameter or \p fallback when it is absent.
inline double param(const Params &p, const std::string &key, double fallback) {
  auto it = p.find(key);
  return it == p.end() ? fallback : it->second;
}

/// "T=5 H=3" style text of named integers.
inline std::string shapeText(std::initializer_list<std::pair<const char *, int64_t>> dims) {
  std::string s;
  for (const auto &d : dims)
    s += (s.empty() ? "" : " ") + std::string(d.first) + "=" + std::to_string(d.second);
  return s;
}

/// The op-stage tasks (one file each under agent/checks/).
TaskSpec routingTask();
TaskSpec ropeTask();
TaskSpec attentionCoreTask();
TaskSpec gluActivationTask();

} // namespace adapt::candidate_check

#endif // ADAPT_AGENT_CHECKS_CHECKHARNESS_H
