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

/// Runs one case: the reference (float64, autograd) and the candidate
/// (float32 poisoned views); compares the output and the gradient of a
/// random projection of it w.r.t. every differentiable input. Appends the
/// case's JSON to \p outcome and adds to its timings.
/// Waits for \p device's queued work (CUDA) so wall-clock timings are real.
inline void synchronize(const torch::Device &device) {
  if (device.is_cuda())
    torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
}

/// \p device: where the candidate's inputs live (CUDA candidates); the
/// reference always runs in float64 on the CPU.
inline void runCase(CandidateFn candidate, const TaskSpec &task, const CheckCase &c,
                    uint64_t seed, TaskOutcome &outcome,
                    const torch::Device &device = torch::kCPU) {
  std::string name = c.shape + (c.shown ? "" : " (unseen shape)");
  std::string status = "passed", detail;
  double fwdErr = 0, bwdErr = 0;
  try {
    std::vector<torch::Tensor> ref64Inputs, leaves, views, baselineInputs;
    for (const CaseInput &in : c.inputs) {
      bool grad = in.differentiable && in.value.is_floating_point();
      ref64Inputs.push_back(in.value.clone().requires_grad_(grad));
      torch::Tensor leaf = in.value.is_floating_point() ? in.value.to(device, torch::kFloat32)
                                                        : in.value.to(device);
      if (grad)
        leaf.requires_grad_(true);
      leaves.push_back(leaf);
      views.push_back(poisoned(leaf));
      baselineInputs.push_back(leaf.detach());
    }
    torch::Tensor ref = task.reference(ref64Inputs, c.params);
    torch::manual_seed(seed + 7919);
    torch::Tensor upstream = torch::randn(ref.sizes(), torch::kFloat64);
    bool anyGrad = false;
    for (const torch::Tensor &t : ref64Inputs)
      anyGrad |= t.requires_grad();
    if (anyGrad)
      (ref * upstream).sum().backward();
    synchronize(device);
    auto start = std::chrono::steady_clock::now();
    torch::Tensor out = candidate(views, c.params);
    synchronize(device);
    outcome.candidateSeconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    start = std::chrono::steady_clock::now();
    try {
      // Timing only: the baseline's own faults never count against the candidate.
      torch::NoGradGuard noGrad;
      task.baseline(baselineInputs, c.params);
      synchronize(device);
      outcome.baselineSeconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } catch (const std::exception &) {
      outcome.baselineFailed = true;
    }
    if (!out.defined() || out.sizes() != ref.sizes()) {
      status = "failed";
      detail = "output shape " + (out.defined() ? c10::str(out.sizes()) : std::string("undefined")) +
               ", expected " + c10::str(ref.sizes());
    } else if (out.device() != device) {
      status = "failed";
      detail = "output is on " + out.device().str() + ", expected " + device.str();
    } else if (!out.is_floating_point()) {
      status = "failed";
      detail = "output is not a floating tensor";
    } else if (!torch::isfinite(out).all().item<bool>()) {
      status = "failed";
      detail = "output has NaN/Inf (poisoned inputs read out of bounds or as contiguous?)";
    } else if ((fwdErr = maxRelError(out.detach().cpu(), ref.detach())) > kTolerance ||
               std::isnan(fwdErr)) {
      status = "failed";
      detail = "forward differs from the reference (max rel error " + std::to_string(fwdErr) + ")";
    } else if (anyGrad && !out.requires_grad()) {
      status = "failed";
      detail = "output does not depend differentiably on the inputs (no backward)";
    } else if (anyGrad) {
      (out * upstream.to(out.device(), out.scalar_type())).sum().backward();
      for (size_t i = 0; i < leaves.size() && status == "passed"; ++i) {
        if (!ref64Inputs[i].requires_grad())
          continue;
        torch::Tensor g = leaves[i].grad(), want = ref64Inputs[i].grad();
        if (g.defined())
          g = g.cpu();
        const std::string &input = c.inputs[i].name;
        if (!g.defined()) {
          status = "failed";
          detail = "no gradient reached input '" + input + "'";
          continue;
        }
        double e = maxRelError(g, want);
        bwdErr = std::max(bwdErr, std::isnan(e) ? 1e30 : e);
        if (!(e <= kTolerance)) {
          status = "failed";
          detail = "backward differs from the reference w.r.t. '" + input +
                   "' (max rel error " + std::to_string(e) + ")";
        }
      }
    }
  } catch (const std::exception &e) {
    status = "failed";
    detail = std::string("threw: ") + e.what();
    detail = detail.substr(0, 600);
  }
  outcome.passed &= status == "passed";
  std::ostringstream os;
  os << "{\"shape\": \"" << jsonEscape(name) << "\", \"status\": \"" << status
     << "\", \"forward_max_rel_error\": " << fwdErr << ", \"backward_max_rel_error\": " << bwdErr
     << ", \"detail\": \"" << jsonEscape(detail) << "\"}";
  outcome.checks.push_back(os.str());
}

/// Runs every case of \p task on \p candidate.
inline TaskOutcome runTask(CandidateFn candidate, const TaskSpec &task, const Params &modelParams,
                           uint64_t seed, const torch::Device &device = torch::kCPU) {
  TaskOutcome outcome;
  std::vector<CheckCase> cases = task.cases(modelParams, seed);
  for (size_t i = 0; i < cases.size(); ++i)
    runCase(candidate, task, cases[i], seed + 101 * i, outcome, device);
  return outcome;
}

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
