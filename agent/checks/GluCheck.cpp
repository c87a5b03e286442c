//===- GluCheck.cpp - op-stage task `glu_activation` ----------------------===//
//
// The gated activation of an expert or MLP, between its gate/up and down
// projections, as transformers 5.17 computes it.
//
// Inputs: gate [T, I], up [T, I]. Output [T, I].
// Params: clamped (0: silu(gate) * up, nn.SiLU; 1: gpt-oss's form),
// alpha, limit (clamped only).
// gpt-oss (GptOssExperts._apply_gate): gate = min(gate, limit),
// up = clamp(up, -limit, limit), out = (up + 1) * gate * sigmoid(gate * alpha).
//
// The reference is that definition in float64, element by element (as
// tensor arithmetic); gradients are checked w.r.t. gate and up. Inputs
// reach beyond +-limit so the clamps are exercised.
//
//===----------------------------------------------------------------------===//

#include "agent/checks/CheckHarness.h"

namespace adapt::candidate_check {
namespace {

/// The float64 reference.
torch::Tensor gluReference(const std::vector<torch::Tensor> &inputs, const Params &p) {
  torch::Tensor gate = inputs[0], up = inputs[1];
  if (param(p, "clamped", 0) == 0)
    return gate * torch::sigmoid(gate) * up;
  double alpha = p.at("alpha"), limit = p.at("limit");
  torch::Tensor g = torch::clamp_max(gate, limit);
  torch::Tensor u = torch::clamp(up, -limit, limit);
  return (u + 1.0) * (g * torch::sigmoid(g * alpha));
}

/// The composite baseline (timing only): the same arithmetic in float32.
torch::Tensor gluBaseline(const std::vector<torch::Tensor> &inputs, const Params &p) {
  return gluReference(inputs, p);
}

std::vector<CheckCase> gluCases(const Params &model, uint64_t seed) {
  struct Shape {
    int64_t tokens, width;
    bool shownInPrompt;
  };
  static const Shape shapes[] = {{5, 16, true}, {7, 33, false}, {1, 1, false},
                                 {13, 64, false}, {3, 257, false}};
  double limit = param(model, "limit", 7.0);
  return casesOf(
      shapes, [&](const Shape &s) { return seed + s.tokens * 17 + s.width; },
      [&](const Shape &s, CheckCase &c) {
        c.shape = shapeText({{"T", s.tokens}, {"I", s.width}});
        c.params = model;
        c.params.emplace("clamped", 0.0);
        double spread = param(model, "clamped", 0) != 0 ? 0.8 * limit : 3.0;
        c.inputs = {{"gate", torch::randn({s.tokens, s.width}, torch::kFloat64) * spread, true},
                    {"up", torch::randn({s.tokens, s.width}, torch::kFloat64) * spread, true}};
      });
}

} // namespace

TaskSpec gluActivationTask() {
  TaskSpec spec{"glu_activation", gluCases, gluReference, gluBaseline};
  spec.missingParams = [](const Params &p) {
    return param(p, "clamped", 0) != 0 ? requireParams(p, {"alpha", "limit"}, "clamped")
                                       : std::string();
  };
  return spec;
}

} // namespace adapt::candidate_check
