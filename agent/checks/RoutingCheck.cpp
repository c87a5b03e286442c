//===- RoutingCheck.cpp - op-stage task `moe_routing` ---------------------===//
//
// MoE router weights: scores (softmax or sigmoid of the logits), optional
// bias correction of the choice, group-limited top-k, optional
// normalisation and routed scaling; a dense [T, E] result. The reference is
// the plain per-token loop definition in float64.
//
// Inputs: logits [T, E], bias [E] (the bias only steers the choice: no
// gradient is checked for it). Params: top_k, n_group, topk_group (per
// case), scoring (0 softmax, 1 sigmoid), use_bias, norm_topk_prob,
// routed_scaling_factor (from the model).
//
//===----------------------------------------------------------------------===//

#include "agent/checks/CheckHarness.h"

#include <algorithm>
#include <limits>

namespace adapt::candidate_check {
namespace {

/// The float64 reference, token by token.
torch::Tensor routingReference(const std::vector<torch::Tensor> &inputs, const Params &p) {
  const torch::Tensor &logits = inputs[0], &bias = inputs[1];
  int64_t T = logits.size(0), E = logits.size(1);
  int64_t topK = int64_t(p.at("top_k")), groups = int64_t(p.at("n_group"));
  int64_t topkGroups = int64_t(p.at("topk_group"));
  bool sigmoid = p.at("scoring") != 0, useBias = p.at("use_bias") != 0;
  torch::Tensor scores = sigmoid ? torch::sigmoid(logits) : torch::softmax(logits, -1);
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> choice(E);
    for (int64_t e = 0; e < E; ++e)
      choice[e] = scores[t][e].item<double>() + (useBias ? bias[e].item<double>() : 0.0);
    int64_t perGroup = E / groups;
    std::vector<std::pair<double, int64_t>> groupScores;
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> members(choice.begin() + g * perGroup,
                                  choice.begin() + (g + 1) * perGroup);
      std::sort(members.rbegin(), members.rend());
      double s = members[0] + (members.size() > 1 ? members[1] : 0.0);
      groupScores.push_back({s, g});
    }
    std::sort(groupScores.begin(), groupScores.end(),
              [](auto a, auto b) { return a.first > b.first; });
    std::vector<bool> allowed(E, groups <= 1);
    for (int64_t i = 0; i < topkGroups && groups > 1; ++i)
      for (int64_t e = 0; e < perGroup; ++e)
        allowed[groupScores[i].second * perGroup + e] = true;
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t e = 0; e < E; ++e)
      if (allowed[e])
        ranked.push_back({choice[e], e});
    std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) { return a.first > b.first; });
    torch::Tensor mask = torch::zeros({E}, logits.options().requires_grad(false));
    for (int64_t i = 0; i < topK; ++i)
      mask[ranked[i].second] = 1.0;
    torch::Tensor w = scores[t] * mask;
    if (p.at("norm_topk_prob") != 0)
      w = w / (w.sum() + 1e-20);
    rows.push_back(w * p.at("routed_scaling_factor"));
  }
  return torch::stack(rows);
}

/// The vectorised composite a straightforward port would write (timing only).
torch::Tensor routingBaseline(const std::vector<torch::Tensor> &inputs, const Params &p) {
  torch::Tensor logits = inputs[0], bias = inputs[1];
  int64_t T = logits.size(0), E = logits.size(1);
  int64_t topK = int64_t(p.at("top_k")), groups = int64_t(p.at("n_group"));
  torch::Tensor scores = p.at("scoring") != 0 ? torch::sigmoid(logits) : torch::softmax(logits, -1);
  torch::Tensor choice = p.at("use_bias") != 0 ? scores + bias : scores;
  if (groups > 1) {
    int64_t per = E / groups;
    torch::Tensor g =
        std::get<0>(choice.view({T, groups, per}).topk(std::min<int64_t>(2, per), -1)).sum(-1);
    torch::Tensor kept = torch::zeros({T, groups}, choice.options())
                             .scatter(1, std::get<1>(g.topk(int64_t(p.at("topk_group")), -1)), 1.0);
    torch::Tensor mask = kept.unsqueeze(-1).expand({T, groups, per}).reshape({T, E});
    choice = choice.masked_fill(mask == 0, -std::numeric_limits<float>::infinity());
  }
  torch::Tensor idx = std::get<1>(choice.topk(topK, -1));
  torch::Tensor w = scores.gather(1, idx);
  if (p.at("norm_topk_prob") != 0)
    w = w / (w.sum(-1, true) + 1e-20);
  return torch::zeros_like(scores).scatter(1, idx, w * p.at("routed_scaling_factor"));
}

/// One test shape of the routing task.
struct RoutingShape {
  int64_t tokens, experts, topK, groups, topkGroups;
  bool shownInPrompt;
};

std::vector<CheckCase> routingCases(const Params &model, uint64_t seed) {
  static const RoutingShape shapes[] = {{5, 8, 2, 4, 2, true},   {7, 16, 4, 4, 2, false},
                                        {3, 12, 3, 3, 1, false}, {11, 6, 2, 1, 1, false},
                                        {2, 32, 8, 8, 4, false}};
  return casesOf(
      shapes, [&](const RoutingShape &s) { return seed + s.tokens * 131 + s.experts; },
      [&](const RoutingShape &s, CheckCase &c) {
        c.shape = shapeText({{"T", s.tokens}, {"E", s.experts}, {"top_k", s.topK},
                             {"n_group", s.groups}, {"topk_group", s.topkGroups}});
        // Defaults where the model says nothing.
        c.params =
            withDefaults(model, {{"scoring", 0}, {"use_bias", 1}, {"norm_topk_prob", 1}, {"routed_scaling_factor", 1.0}});
        c.params["top_k"] = double(s.topK);
        c.params["n_group"] = double(s.groups);
        c.params["topk_group"] = double(s.topkGroups);
        // Distinct logits (a permutation plus small noise): no near-ties in top-k.
        torch::Tensor logits = torch::empty({s.tokens, s.experts}, torch::kFloat64);
        for (int64_t t = 0; t < s.tokens; ++t)
          logits[t] = (torch::randperm(s.experts, torch::kFloat64) +
                       0.3 * torch::rand({s.experts}, torch::kFloat64)) * (3.0 / s.experts);
        c.inputs = {{"logits", logits, true},
                    {"bias", 0.05 * torch::randn({s.experts}, torch::kFloat64), false}};
      });
}

} // namespace

TaskSpec routingTask() {
  return {"moe_routing", routingCases, routingReference, routingBaseline};
}

} // namespace adapt::candidate_check
