//===- OpCheckLightning.cpp - op-stage checks: lightning attention --------===//
//
// MiniMax's lightning attention (runtime/Lightning.h), blocked and recurrent
// forms, against the float64 definition written here as a plain sum:
//
//   o_t = sum_{j <= t} exp(-s_h (t - j)) (q_t . k_j) v_j,
//
// forward and backward (q, k, v), with T a multiple of the block, not a
// multiple, and shorter than one block, and several head counts (the decay
// slopes depend on the head count and the layer). The segmented form runs
// the sequence in two parts, the second from the first's final state (as
// context parallelism does), so the gradients also cross the state.
//
//===----------------------------------------------------------------------===//

#include "runtime/Lightning.h"
#include "validation/opcheck/OpCheckHarness.h"

namespace adapt::rt::opcheck {

namespace {

/// Decay slopes in float64 from transformers' formula (get_slope_rate).
Tensor refSlopes(int64_t heads, int64_t layer, int64_t layers) {
  Tensor exponent = torch::arange(1, heads + 1, f64);
  Tensor rate = torch::pow(torch::full({heads}, 1.0 / std::pow(2.0, 8.0 / double(heads)), f64), exponent);
  return rate * (1.0 - double(layer) / (double(layers) - 1.0 + 1e-5) + 1e-5);
}

/// The definition: every (query, key) pair weighted by its decay, in float64.
Tensor refLightning(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &slopes) {
  const int64_t T = q.size(2);
  Tensor pos = torch::arange(T, f64);
  Tensor gap = pos.view({T, 1}) - pos.view({1, T});                           // t - j
  Tensor weight = torch::exp(-slopes.view({1, -1, 1, 1}) * gap.clamp_min(0)); // [1, H, T, T]
  weight = weight * (gap >= 0).to(f64);
  return torch::matmul(torch::matmul(q, k.transpose(-1, -2)) * weight, v);
}

struct LightningCase {
  int64_t B, H, T, dk, dv, block; ///< block 0: the recurrent form.
  int64_t layer, layers;
  int64_t segment = 0; ///< > 0: the blocked form on [0, segment), then on the rest from its final state.
};

Trial lightningTrial(const Ctx &c, const LightningCase &a) {
  Input q = input(c, torch::randn({a.B, a.H, a.T, a.dk}, f64) * 0.5, true);
  Input k = input(c, torch::randn({a.B, a.H, a.T, a.dk}, f64) * 0.5, true);
  Input v = input(c, torch::randn({a.B, a.H, a.T, a.dv}, f64), true);
  Tensor slopes = lightningSlopes(a.H, a.layer, a.layers);
  Tensor ours;
  if (a.segment > 0) {
    auto part = [&](const Tensor &x, int64_t from, int64_t to) { return x.narrow(2, from, to - from); };
    Tensor carried;
    Tensor first = lightningAttentionBlocked(part(q.ours, 0, a.segment), part(k.ours, 0, a.segment),
                                             part(v.ours, 0, a.segment), slopes, a.block, {}, &carried);
    Tensor second = lightningAttentionBlocked(part(q.ours, a.segment, a.T), part(k.ours, a.segment, a.T),
                                              part(v.ours, a.segment, a.T), slopes, a.block, carried);
    ours = torch::cat({first, second}, 2);
  } else {
    ours = a.block > 0 ? lightningAttentionBlocked(q.ours, k.ours, v.ours, slopes, a.block)
                       : lightningAttentionRecurrent(q.ours, k.ours, v.ours, slopes);
  }
  Tensor ref = refLightning(q.ref, k.ref, v.ref, slopes.to(f64));
  Trial t{{"slopes", slopes, refSlopes(a.H, a.layer, a.layers)}, {"out", ours, ref}};
  backward(t, ours, ref, {{"q", &q}, {"k", &k}, {"v", &v}});
  return t;
}

} // namespace

void addLightningChecks(std::vector<Check> &all) {
  auto add = [&](const char *id, LightningCase a) {
    std::string shape = shapeText({{"B", a.B}, {"H", a.H}, {"T", a.T}, {"dk", a.dk}, {"dv", a.dv}}) +
                        (a.block > 0 ? " block" + std::to_string(a.block) : "") + " layer" +
                        std::to_string(a.layer) + "/" + std::to_string(a.layers) +
                        (a.segment > 0 ? " S" + std::to_string(a.segment) : "");
    addCheck(all, id, shape, [=](const Ctx &c) { return lightningTrial(c, a); });
  };
  // Blocked: T a multiple of the block, not a multiple, shorter than one
  // block; 1, 3, 4 and 8 heads; the first, a middle and the last layer.
  add("lightning.blocked", {2, 4, 16, 8, 8, 4, 0, 4});
  add("lightning.blocked", {2, 4, 13, 8, 8, 4, 1, 4});
  add("lightning.blocked", {1, 3, 29, 16, 16, 8, 2, 5});
  add("lightning.blocked", {2, 8, 7, 16, 16, 16, 3, 4});
  add("lightning.blocked", {1, 1, 37, 12, 12, 5, 0, 1});
  add("lightning.blocked", {2, 3, 67, 16, 24, 16, 4, 5});
  // More blocks than one group of the state scan (16; 300 blocks of 2 give
  // two levels of groups and a ragged last group); the last layer, whose
  // decay is slowest, carries the state furthest.
  add("lightning.blocked", {1, 2, 600, 8, 8, 2, 3, 4});
  // MiniMax's head width 128: in bf16 on a GPU these take the delta rule's
  // kernels (ADAPT_LIGHTNING_KERNEL=0: the composition) in chunks of 64: three chunks, the
  // last ragged; one short chunk.
  add("lightning.blocked", {2, 2, 150, 128, 128, 64, 1, 4});
  add("lightning.blocked", {1, 4, 40, 128, 128, 256, 0, 2});
  // Whole chunks: the kernels read v and dO in place (no copies), as at
  // the benchmarks' lengths.
  add("lightning.blocked", {1, 2, 128, 128, 128, 256, 2, 4});
  // Two parts through the state: the first part's last block full, ragged,
  // and the first part shorter than one block.
  add("lightning.segmented", {2, 4, 24, 8, 8, 4, 1, 4, 12});
  add("lightning.segmented", {1, 3, 29, 16, 16, 8, 2, 5, 13});
  add("lightning.segmented", {2, 2, 20, 16, 24, 16, 0, 3, 5});
  add("lightning.segmented", {1, 2, 203, 8, 8, 3, 3, 4, 101});
  add("lightning.segmented", {1, 2, 200, 128, 128, 64, 3, 4, 70});
  // The recurrent reference form.
  add("lightning.recurrent", {2, 4, 13, 8, 8, 0, 1, 4});
  add("lightning.recurrent", {1, 3, 29, 16, 16, 0, 2, 5});
  add("lightning.recurrent", {2, 8, 7, 16, 24, 0, 0, 2});
}

} // namespace adapt::rt::opcheck
