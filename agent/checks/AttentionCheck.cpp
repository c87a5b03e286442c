//===- AttentionCheck.cpp - op-stage task `attention_core` ----------------===//
//
// Causal softmax attention after the projections and RoPE, as transformers
// 5.17's eager attention computes it (gpt-oss for the sinks).
//
// Inputs: q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D] (grouped-query: query
// head h reads key/value head h / (Hq / Hkv), as repeat_kv), sinks [Hq]
// (one learned logit per query head; read only when use_sinks != 0).
// Output [T, Hq, D].
// Params: scale (logit multiplier), window (0 = full causal; else HF's
// sliding window: query t sees keys s with t - window < s <= t), use_sinks.
// The model-level `window` (its sliding window, absent = none) decides
// whether the cases use windows; each case sets its own.
//
// The reference is the definition written out in float64, query by query
// and head by head: logits over the visible keys times scale, the head's
// sink appended as one more logit (it takes probability mass but has no
// value), softmax, and the probabilities times the visible values.
// Gradients are checked w.r.t. q, k, v and the sinks.
//
//===----------------------------------------------------------------------===//

#include "agent/checks/CheckHarness.h"

#include <limits>

namespace adapt::candidate_check {
namespace {

/// The float64 reference, one query position and head at a time.
torch::Tensor attentionReference(const std::vector<torch::Tensor> &inputs, const Params &p) {
  const torch::Tensor &q = inputs[0], &k = inputs[1], &v = inputs[2], &sinks = inputs[3];
  int64_t T = q.size(0), heads = q.size(1), kvHeads = k.size(1);
  int64_t perKv = heads / kvHeads, window = int64_t(param(p, "window", 0));
  bool useSinks = param(p, "use_sinks", 0) != 0;
  double scale = p.at("scale");
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<torch::Tensor> perHead;
    for (int64_t h = 0; h < heads; ++h) {
      int64_t kv = h / perKv;
      int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
      torch::Tensor keys = k.slice(0, first, t + 1).select(1, kv);   // [n, D]
      torch::Tensor values = v.slice(0, first, t + 1).select(1, kv); // [n, D]
      torch::Tensor logits = keys.matmul(q[t][h]) * scale;           // [n]
      if (useSinks)
        logits = torch::cat({logits, sinks.slice(0, h, h + 1)});
      torch::Tensor probabilities = torch::softmax(logits, 0).slice(0, 0, keys.size(0));
      perHead.push_back(probabilities.matmul(values));
    }
    rows.push_back(torch::stack(perHead));
  }
  return torch::stack(rows);
}

/// A straightforward composite (timing only): masked matmul attention.
torch::Tensor attentionBaseline(const std::vector<torch::Tensor> &inputs, const Params &p) {
  torch::Tensor q = inputs[0].transpose(0, 1), k = inputs[1].transpose(0, 1);
  torch::Tensor v = inputs[2].transpose(0, 1);
  int64_t T = q.size(1), perKv = q.size(0) / k.size(0);
  k = k.repeat_interleave(perKv, 0);
  v = v.repeat_interleave(perKv, 0);
  torch::Tensor logits = q.matmul(k.transpose(1, 2)) * p.at("scale");
  torch::Tensor positions = torch::arange(T, q.options().dtype(torch::kLong));
  torch::Tensor i = positions.unsqueeze(1), j = positions.unsqueeze(0);
  torch::Tensor visible = j <= i;
  if (int64_t window = int64_t(param(p, "window", 0)); window > 0)
    visible = visible & (j > i - window);
  logits = logits.masked_fill(~visible, -std::numeric_limits<float>::infinity());
  if (param(p, "use_sinks", 0) != 0)
    logits = torch::cat({logits, inputs[3].view({-1, 1, 1}).expand({q.size(0), T, 1})}, -1);
  torch::Tensor probabilities = torch::softmax(logits, -1).narrow(-1, 0, T);
  return probabilities.matmul(v).transpose(0, 1);
}

/// One test shape.
struct AttentionShape {
  int64_t tokens, heads, kvHeads, headDim, window;
  bool shownInPrompt;
};

std::vector<CheckCase> attentionCases(const Params &model, uint64_t seed) {
  // A model window > 0 means sliding-window layers: every case then has a
  // window (small ones exercise the boundary; one case uses the model's).
  int64_t modelWindow = int64_t(param(model, "window", 0));
  bool sliding = modelWindow > 0;
  bool sinks = param(model, "use_sinks", 0) != 0;
  std::vector<AttentionShape> shapes = {{6, 4, 2, 8, 3, true},    {9, 6, 2, 5, 4, false},
                                        {1, 3, 3, 16, 2, false},  {13, 2, 1, 12, 1, false},
                                        {7, 8, 4, 4, 10, false}};
  if (sliding && modelWindow <= 256)
    shapes.push_back({modelWindow + 5, 2, 1, 8, modelWindow, false}); // The model's window.
  return casesOf(
      shapes, [&](const AttentionShape &s) { return seed + s.tokens * 53 + s.heads * 7 + s.headDim; },
      [&](const AttentionShape &s, CheckCase &c) {
        int64_t window = sliding ? s.window : 0;
        c.shape = shapeText({{"T", s.tokens}, {"Hq", s.heads}, {"Hkv", s.kvHeads}, {"D", s.headDim}});
        if (sliding)
          c.shape += " window=" + std::to_string(window);
        c.params = model;
        c.params["window"] = double(window);
        c.params["use_sinks"] = sinks ? 1.0 : 0.0;
        c.params["scale"] = 1.0 / std::sqrt(double(s.headDim));
        c.inputs = {{"q", torch::randn({s.tokens, s.heads, s.headDim}, torch::kFloat64), true},
                    {"k", torch::randn({s.tokens, s.kvHeads, s.headDim}, torch::kFloat64), true},
                    {"v", torch::randn({s.tokens, s.kvHeads, s.headDim}, torch::kFloat64), true},
                    {"sinks", torch::randn({s.heads}, torch::kFloat64), sinks}};
      });
}

} // namespace

TaskSpec attentionCoreTask() {
  return {"attention_core", attentionCases, attentionReference, attentionBaseline};
}

} // namespace adapt::candidate_check
