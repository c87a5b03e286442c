//===- OpCheckHarness.h - shared pieces of the op stage --------*- C++ -*-===//
//
// The trial harness of adapt-op-check: inputs rounded to the tested dtype
// with float64 twins for the reference, one random cotangent backward, the
// relative error metric, and the Check record. Each OpCheck*.cpp adds the
// checks of one op family through an add*Checks function declared here.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TOOLS_OPCHECKHARNESS_H
#define ADAPT_RUNTIME_TOOLS_OPCHECKHARNESS_H

#include "runtime/Errors.h"

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace adapt::rt::opcheck {

using torch::Tensor;

inline const double kInf = std::numeric_limits<double>::infinity();
inline const auto f64 = torch::kFloat64;
inline const auto i64 = torch::kInt64;

/// Where and in what dtype one trial runs, and its generator seed.
struct Ctx { torch::ScalarType dtype; torch::Device device; uint64_t seed; };

/// One compared tensor pair, or a verdict computed by the trial (error >= 0).
struct Item { std::string name; Tensor ours, ref; bool backward = false; double error = -1.0; std::string where; };
using Trial = std::vector<Item>;

/// A verdict item: passes when \p problem is empty.
inline Item verdict(std::string name, std::string problem) {
  return {std::move(name), {}, {}, false, problem.empty() ? 0.0 : kInf, std::move(problem)};
}

/// An input as our op sees it (tested dtype, device) and as the reference
/// does (float64 of the same rounded values, CPU).
struct Input { Tensor ours, ref; };

/// \p values rounded to the tested dtype, stored as \p store (default: the
/// tested dtype) for our op; both sides are leaves, requiring grad if asked.
inline Input input(const Ctx &c, const Tensor &values, bool grad, std::optional<torch::ScalarType> store = std::nullopt) {
  Tensor rounded = values.to(c.dtype);
  return {rounded.to(c.device, store.value_or(c.dtype)).detach().requires_grad_(grad),
          rounded.to(f64).detach().requires_grad_(grad)};
}

template <typename T> std::string str(const T &sizes) {
  std::ostringstream os;
  os << c10::IntArrayRef(sizes);
  return os.str();
}

inline Tensor indices(const std::vector<int64_t> &v) { return torch::tensor(v, i64); }

/// Backpropagates one random cotangent (rounded to our output's dtype)
/// through both outputs and adds the gradients of \p inputs as items.
inline void backward(Trial &t, const Tensor &ours, const Tensor &ref, std::vector<std::pair<std::string, Input *>> inputs) {
  if (ours.sizes() == ref.sizes()) {
    Tensor cot = torch::randn(ref.sizes(), f64).to(ours.scalar_type());
    ours.backward(cot.to(ours.device()));
    ref.backward(cot.to(f64));
  }
  for (auto &[name, in] : inputs)
    t.push_back({"grad " + name, in->ours.grad(), in->ref.grad(), true});
}

/// ||ours - ref|| / ||ref|| and the index of the worst element.
inline std::pair<double, std::string> measure(const Tensor &ours, const Tensor &ref) {
  if (!ours.defined())
    return {kInf, "no gradient"};
  if (ours.sizes() != ref.sizes())
    return {kInf, "shape " + str(ours.sizes()) + ", expected " + str(ref.sizes())};
  Tensor a = ours.detach().to(torch::kCPU, f64), b = ref.detach().to(f64);
  Tensor diff = (a - b).abs();
  diff = torch::where(torch::isfinite(diff), diff, torch::full_like(diff, kInf)); // NaN/Inf never pass
  std::string where;
  if (diff.numel() > 0) {
    int64_t flat = diff.reshape({-1}).argmax().item<int64_t>();
    std::vector<int64_t> idx(a.dim());
    for (int64_t d = a.dim() - 1; d >= 0; flat /= a.size(d), --d)
      idx[d] = flat % a.size(d);
    where = str(idx);
  }
  if (!torch::isfinite(a).all().item<bool>())
    return {kInf, where + " (non-finite output)"};
  double num = diff.norm().item<double>(), den = b.norm().item<double>();
  if (!std::isfinite(num))
    return {kInf, where};
  return {num == 0.0 ? 0.0 : num / std::max(den, 1e-300), where};
}

using Note = std::function<std::string(torch::ScalarType, torch::Device)>; ///< dtype/device-dependent shape detail
struct Check { std::string id, shape; std::function<Trial(const Ctx &)> run; Note note; };

/// "B2 T7 D10" from named dimensions: the shape column of the records.
inline std::string shapeText(std::initializer_list<std::pair<const char *, int64_t>> dims) {
  std::string s;
  for (auto &[k, v] : dims)
    s += (s.empty() ? "" : " ") + std::string(k) + std::to_string(v);
  return s;
}

/// Appends one check to \p all.
inline void addCheck(std::vector<Check> &all, std::string id, std::string shape,
                     std::function<Trial(const Ctx &)> fn, Note note = {}) {
  all.push_back({std::move(id), std::move(shape), std::move(fn), std::move(note)});
}

/// Linear attention: short convolution, gated delta rule (chunked and
/// recurrent), Kimi delta attention, lightning attention, gated norms
/// (OpCheckLinear.cpp).
void addLinearAttentionChecks(std::vector<Check> &all);
/// DeepSeek sparse attention: indexer, top-k selection, sparse MLA
/// (OpCheckSparse.cpp).
void addSparseAttentionChecks(std::vector<Check> &all);
/// The Qwen3-VL vision tower's ops (OpCheckVision.cpp).
void addVisionChecks(std::vector<Check> &all);
/// MiniMax lightning attention, blocked and recurrent (OpCheckLightning.cpp).
void addLightningChecks(std::vector<Check> &all);
/// The fused, chunked LM head and cross-entropy (OpCheckLoss.cpp).
void addLossChecks(std::vector<Check> &all);
/// The routed experts' MLP with LoRA folded into the grouped GEMMs
/// (OpCheckFusedExperts.cpp).
void addFusedExpertChecks(std::vector<Check> &all);
/// The MoE router's fp32 logits, by the exact bf16 node where it applies
/// (OpCheckRouterLogits.cpp).
void addRouterLogitsChecks(std::vector<Check> &all);
/// A frozen linear with its LoRA adapter, as one node and as the
/// composition (OpCheckLoraLinear.cpp).
void addLoraLinearChecks(std::vector<Check> &all);

} // namespace adapt::rt::opcheck

#endif // ADAPT_RUNTIME_TOOLS_OPCHECKHARNESS_H
