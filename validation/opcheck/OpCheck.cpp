//===- OpCheck.cpp - the op stage of the validation ladder ----------------===//
//
// adapt-op-check: every op variant of runtime/Ops.h, and the expert LoRA path
// of Layers.h, against an independent float64 reference written here. Fresh
// random inputs (never zeros) at odd and prime shapes, several seeds, forward
// and backward (autograd of our op in the tested dtype against autograd of
// the reference, one random cotangent), in fp32 and bf16. In bf16 the inputs
// are rounded first and the reference computes in float64 from those same
// rounded values. Error: ||ours - ref|| / ||ref|| over every element; a wrong
// shape or dtype, a non-finite output or a non-finite error never passes.
//
// Records: DIR/op-stage.json (one entry per check and seed) and
// DIR/op-stage.md. Exit 0 all passed, 4 a check failed, 2 bad usage.
// --self-test runs the interleaved RoPE op against a half-rotation reference
// and succeeds only when the checker calls that deliberate mismatch a failure.
//
//===----------------------------------------------------------------------===//

#include "runtime/CommandLine.h"
#include "runtime/ExpertRows.h"
#include "runtime/FileSystem.h"
#include "runtime/Json.h"
#include "runtime/Layers.h"
#include "runtime/Ops.h"
#include "runtime/Sha256.h"
#include "validation/opcheck/OpCheckHarness.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef ADAPT_RUNTIME_LIBRARY
#define ADAPT_RUNTIME_LIBRARY ""
#endif

using namespace adapt::rt;
using namespace adapt::rt::opcheck;
using torch::Tensor;

namespace {

//===-- rms_norm ----------------------------------------------------------===//

Trial rmsNormTrial(const Ctx &c, int64_t B, int64_t T, int64_t D, bool withWeight) {
  Input x = input(c, torch::randn({B, T, D}, f64) * 1.5 + 0.3, true);
  Input w = input(c, torch::randn({D}, f64) * 0.5 + 1.0, true);
  const double eps = 1e-6;
  Tensor ours = rmsNorm(x.ours, withWeight ? w.ours : Tensor(), eps);
  Tensor ref = x.ref / torch::sqrt((x.ref * x.ref).sum(-1, true) / double(D) + eps);
  if (withWeight)
    ref = ref * w.ref;
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, withWeight ? std::vector<std::pair<std::string, Input *>>{{"x", &x}, {"weight", &w}}
                                    : std::vector<std::pair<std::string, Input *>>{{"x", &x}});
  return t;
}

/// The decoder's residual stream into its norm (residualRmsNorm): h =
/// r + a (or r alone, \p withBranch false) and norm(h) scaled by w or
/// (1 + w), compared as one tensor [h, norm(h)] so that one cotangent drives
/// both outputs: r's gradient is then the stream's plus the norm's, which the
/// GPU's backward kernel sums in one pass (ADAPT_RESIDUAL_NORM_KERNEL=1).
Trial residualRmsNormTrial(const Ctx &c, int64_t B, int64_t T, int64_t D, bool withBranch, bool zeroCentred) {
  Input r = input(c, torch::randn({B, T, D}, f64) * 1.5 + 0.3, true);
  Input a = input(c, torch::randn({B, T, D}, f64), withBranch);
  Input w = input(c, torch::randn({D}, f64) * 0.5 + (zeroCentred ? 0.0 : 1.0), true);
  const double eps = 1e-6;
  auto [h, y] = residualRmsNorm(r.ours, withBranch ? a.ours : Tensor(), w.ours, eps, zeroCentred);
  Tensor ours = torch::cat({h, y}, -1);
  Tensor refH = withBranch ? r.ref + a.ref : r.ref;
  Tensor refY = refH / torch::sqrt((refH * refH).sum(-1, true) / double(D) + eps) * (zeroCentred ? 1.0 + w.ref : w.ref);
  Tensor ref = torch::cat({refH, refY}, -1);
  Trial t{{"out", ours, ref}};
  std::vector<std::pair<std::string, Input *>> grads{{"residual", &r}, {"weight", &w}};
  if (withBranch)
    grads.push_back({"branch", &a});
  backward(t, ours, ref, grads);
  return t;
}

//===-- RoPE --------------------------------------------------------------===//

/// Inverse frequencies and the cos/sin multiplier, in double, from the
/// formulas of transformers' modeling_rope_utils (default, YaRN, llama3).
std::pair<std::vector<double>, double> ropeReference(const RopeDef &r) {
  const int64_t dim = r.rotaryDim, half = dim / 2;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(r.theta, 2.0 * double(i) / double(dim));
  double factor = 1.0;
  if (r.scaling == "yarn") {
    auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    factor = (r.mscale != 0.0 && r.mscaleAllDim != 0.0) ? mscale(r.factor, r.mscale) / mscale(r.factor, r.mscaleAllDim)
                                                        : mscale(r.factor, 1.0);
    auto correctionDim = [&](double rotations) {
      return dim * std::log(double(r.originalMaxPositions) / (rotations * 2.0 * M_PI)) / (2.0 * std::log(r.theta));
    };
    double low = correctionDim(r.betaFast), high = correctionDim(r.betaSlow);
    if (r.truncate)
      low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
    if (low == high)
      high += 0.001;
    for (int64_t i = 0; i < half; ++i) { // ramp 0: extrapolate (keep), 1: interpolate (/factor)
      double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      inv[i] = inv[i] / r.factor * ramp + inv[i] * (1.0 - ramp);
    }
  } else if (r.scaling == "llama3") {
    const double old = double(r.originalMaxPositions);
    const double lowWavelen = old / r.lowFreqFactor, highWavelen = old / r.highFreqFactor;
    for (int64_t i = 0; i < half; ++i) {
      double wavelen = 2.0 * M_PI / inv[i];
      if (wavelen > lowWavelen) {
        inv[i] /= r.factor; // low frequency: interpolated
      } else if (wavelen >= highWavelen) { // medium: smoothed; high frequency: unchanged
        double smooth = (old / wavelen - r.lowFreqFactor) / (r.highFreqFactor - r.lowFreqFactor);
        inv[i] = (1.0 - smooth) * inv[i] / r.factor + smooth * inv[i];
      }
    }
  }
  return {inv, factor};
}

/// Rotates pairs of the first \p rot dims of x [B, H, T, D] as complex
/// numbers, (a + ib) * m e^{i t f}; pair i is (i, i + rot/2) or (2i, 2i+1).
Tensor refRope(const Tensor &x, const std::vector<double> &inv, double m, int64_t rot, bool interleaved) {
  const int64_t T = x.size(2), pairs = rot / 2;
  std::vector<int64_t> ia(pairs), ib(pairs);
  Tensor cosT = torch::empty({T, pairs}, f64), sinT = torch::empty({T, pairs}, f64);
  auto cs = cosT.accessor<double, 2>(), sn = sinT.accessor<double, 2>();
  for (int64_t i = 0; i < pairs; ++i) {
    ia[i] = interleaved ? 2 * i : i;
    ib[i] = interleaved ? 2 * i + 1 : i + pairs;
    for (int64_t t = 0; t < T; ++t) {
      cs[t][i] = m * std::cos(double(t) * inv[i]);
      sn[t][i] = m * std::sin(double(t) * inv[i]);
    }
  }
  Tensor a = x.index_select(-1, indices(ia)), b = x.index_select(-1, indices(ib));
  return x.index_copy(-1, indices(ia), a * cosT - b * sinT).index_copy(-1, indices(ib), a * sinT + b * cosT);
}

/// applyRope(ropeTables(rope)) on x [2, 3, T, D]; the reference rotates
/// pairs the \p refInterleaved way (other than rope's only in the self-test).
/// \p strided: x laid out [2, T, 3, D] and viewed as [2, 3, T, D], as
/// attention's heads come from a projection.
Trial ropeTrial(const Ctx &c, int64_t T, int64_t D, const RopeDef &rope, bool refInterleaved, bool strided = false) {
  Input x = input(c, torch::randn({2, 3, T, D}, f64), true);
  RopeTables tables = ropeTables(rope, T, c.device);
  Tensor in = strided ? x.ours.transpose(1, 2).contiguous().transpose(1, 2) : x.ours;
  Tensor ours = applyRope(in, tables, rope.interleaved);
  auto [inv, factor] = ropeReference(rope);
  Tensor ref = refRope(x.ref, inv, factor, rope.rotaryDim, refInterleaved);
  std::string bad; // the tables: finite fp32 [T, rotaryDim] on the device
  for (const Tensor *tab : {&tables.cos, &tables.sin})
    if (tab->sizes() != c10::IntArrayRef{T, rope.rotaryDim} || tab->scalar_type() != torch::kFloat32 ||
        tab->device().type() != c.device.type() || !torch::isfinite(*tab).all().item<bool>())
      bad = "table " + str(tab->sizes()) + " " + c10::toString(tab->scalar_type()) + ", expected finite float32 [" +
            std::to_string(T) + ", " + std::to_string(rope.rotaryDim) + "]";
  Trial t{{"out", ours, ref},
          verdict("tables", bad),
          {"inv_freq", ropeInverseFrequencies(rope), torch::tensor(inv, f64)},
          {"attention_factor", torch::tensor({ropeAttentionFactor(rope)}, f64), torch::tensor({factor}, f64)}};
  backward(t, ours, ref, {{"x", &x}});
  return t;
}

//===-- attention ---------------------------------------------------------===//

/// Heads, kv heads, length, q/k and v head dims; scale 0: 1/sqrt(Dq).
struct AttnCase { int64_t H, KV, T, Dq, Dv; double scale = 0.0; int64_t window = 0, chunk = 0; bool sinks = false; };

/// Per query i: keys j <= i (within the window and i's chunk), softmax in
/// double with the sink logit in the denominator only.
Tensor refAttention(const Tensor &q, const Tensor &k, const Tensor &v, double scale, const AttnCase &a,
                    const Tensor &sinks) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), perKv = H / k.size(1);
  std::vector<int64_t> head(H);
  for (int64_t h = 0; h < H; ++h)
    head[h] = h / perKv; // query head h reads kv head h / (H / KV)
  Tensor kk = k.index_select(1, indices(head)), vv = v.index_select(1, indices(head));
  std::vector<Tensor> outs;
  for (int64_t i = 0; i < T; ++i) {
    std::vector<int64_t> keys;
    for (int64_t j = 0; j <= i; ++j)
      if ((a.window <= 0 || i - j < a.window) && (a.chunk <= 0 || j / a.chunk == i / a.chunk))
        keys.push_back(j);
    Tensor kj = kk.index_select(2, indices(keys)), vj = vv.index_select(2, indices(keys)); // [B, H, n, D]
    Tensor logits = (q.select(2, i).unsqueeze(2) * kj).sum(-1) * scale;                  // [B, H, n]
    Tensor m = std::get<0>(logits.max(-1, true)).detach(), sink;
    if (sinks.defined()) {
      sink = sinks.view({1, H, 1}).expand({B, H, 1});
      m = torch::maximum(m, sink.detach());
    }
    Tensor e = torch::exp(logits - m), denom = e.sum(-1, true);
    if (sinks.defined())
      denom = denom + torch::exp(sink - m);
    outs.push_back(((e / denom).unsqueeze(-1) * vj).sum(2)); // [B, H, Dv]
  }
  return torch::stack(outs, 2);
}

Trial attentionTrial(const Ctx &c, const AttnCase &a) {
  Input q = input(c, torch::randn({2, a.H, a.T, a.Dq}, f64), true);
  Input k = input(c, torch::randn({2, a.KV, a.T, a.Dq}, f64), true);
  Input v = input(c, torch::randn({2, a.KV, a.T, a.Dv}, f64), true);
  Input s = input(c, torch::randn({a.H}, f64), true);
  const double scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(double(a.Dq));
  Tensor ours = attention(q.ours, k.ours, v.ours, scale, AttentionMask{a.window, a.chunk}, a.sinks ? s.ours : Tensor());
  Tensor ref = refAttention(q.ref, k.ref, v.ref, scale, a, a.sinks ? s.ref : Tensor());
  Trial t{{"out", ours, ref}};
  std::vector<std::pair<std::string, Input *>> grads{{"q", &q}, {"k", &k}, {"v", &v}};
  if (a.sinks)
    grads.push_back({"sinks", &s});
  backward(t, ours, ref, grads);
  return t;
}

//===-- route -------------------------------------------------------------===//

/// Experts [N, k], differentiable weights [N, k], and the smallest score gap
/// at a selection boundary.
struct RefRoute { Tensor experts, weights; double margin = kInf; };

/// Indices 0..n-1 sorted by descending \p score.
std::vector<int64_t> ranked(const std::vector<double> &score) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return score[x] > score[y]; });
  return order;
}

/// Per token, in double: selection scores, the group limit, top-k by sort;
/// the weights from the differentiable logits \p l [N, E].
RefRoute refRoute(const Tensor &l, const Tensor &bias, const FfnDef &f) {
  const int64_t N = l.size(0), E = l.size(1), k = f.topK;
  Tensor value, select; // what weights are taken from; what selection ranks
  if (f.router == RouterKind::SoftmaxTopK) {
    Tensor e = torch::exp(l - std::get<0>(l.max(-1, true)).detach());
    value = e / e.sum(-1, true);
    select = value.detach();
  } else if (f.router == RouterKind::SigmoidTopK) {
    value = 1.0 / (1.0 + torch::exp(-l));
    select = bias.defined() ? value.detach() + bias : value.detach();
  } else {
    select = l.detach();
  }
  select = select.contiguous();
  auto acc = select.accessor<double, 2>();
  RefRoute r;
  std::vector<int64_t> chosen;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> score(&acc[n][0], &acc[n][0] + E);
    if (f.router == RouterKind::SigmoidTopK && f.groups > 1) {
      const int64_t per = E / f.groups; // a group scores the sum of its best two
      std::vector<double> groupScore(f.groups);
      for (int64_t g = 0; g < f.groups; ++g) {
        std::vector<double> s(score.begin() + g * per, score.begin() + (g + 1) * per);
        std::sort(s.rbegin(), s.rend());
        groupScore[g] = s[0] + (per > 1 ? s[1] : 0.0);
      }
      std::vector<int64_t> order = ranked(groupScore);
      if (f.topKGroups < f.groups)
        r.margin = std::min(r.margin, groupScore[order[f.topKGroups - 1]] - groupScore[order[f.topKGroups]]);
      for (int64_t g = f.topKGroups; g < f.groups; ++g)
        for (int64_t e = order[g] * per; e < (order[g] + 1) * per; ++e)
          score[e] = 0.0; // experts of dropped groups score 0 (DeepSeek-V3's masked_fill)
    }
    std::vector<int64_t> order = ranked(score);
    if (k < E)
      r.margin = std::min(r.margin, score[order[k - 1]] - score[order[k]]);
    chosen.insert(chosen.end(), order.begin(), order.begin() + k);
  }
  r.experts = indices(chosen).view({N, k});
  if (f.router == RouterKind::SoftmaxTopK || f.router == RouterKind::SigmoidTopK) {
    Tensor w = value.gather(1, r.experts);
    if (f.normTopK)
      w = w / (w.sum(-1, true) + (f.router == RouterKind::SigmoidTopK ? 1e-20 : 0.0));
    r.weights = w * f.routedScaling;
  } else if (f.router == RouterKind::TopKSoftmax) {
    Tensor top = l.gather(1, r.experts);
    Tensor e = torch::exp(top - std::get<0>(top.max(-1, true)).detach());
    r.weights = e / e.sum(-1, true);
  } else {
    r.weights = 1.0 / (1.0 + torch::exp(-l.gather(1, r.experts)));
  }
  return r;
}

/// Per token a random permutation of the experts: well-separated logits
/// (steps of 0.5) plus noise below 0.05.
Tensor separatedLogits(int64_t N, int64_t E) {
  std::vector<Tensor> rows;
  for (int64_t n = 0; n < N; ++n)
    rows.push_back(torch::randperm(E, i64).to(f64));
  return (torch::stack(rows) - (E - 1) / 2.0) * 0.5 + (torch::rand({N, E}, f64) - 0.5) * 0.1;
}

Trial routeTrial(const Ctx &c, int64_t N, int64_t E, const FfnDef &f, bool withBias) {
  Input l, b;
  RefRoute ref;
  for (int attempt = 0; attempt < 100; ++attempt) { // redraw (rarely) while a boundary is a near-tie
    l = input(c, separatedLogits(N, E), true);
    b = input(c, (torch::rand({E}, f64) - 0.5) * 0.2, false);
    ref = refRoute(l.ref, withBias ? b.ref : Tensor(), f);
    if (ref.margin > 1e-3)
      break;
  }
  Routing ours = route(l.ours, f, withBias ? b.ours : Tensor());
  // Selected experts, as sets per token.
  std::string bad;
  Tensor oe = ours.experts.defined() ? ours.experts.to(torch::kCPU) : Tensor();
  if (!oe.defined() || oe.sizes() != ref.experts.sizes() || oe.scalar_type() != i64)
    bad = "experts " + (oe.defined() ? str(oe.sizes()) : std::string("undefined")) + ", expected int64 " +
          str(ref.experts.sizes());
  for (int64_t n = 0; bad.empty() && n < N; ++n) {
    auto set = [&](const Tensor &e) {
      std::vector<int64_t> v(e[n].data_ptr<int64_t>(), e[n].data_ptr<int64_t>() + f.topK);
      std::sort(v.begin(), v.end());
      return v;
    };
    if (set(oe.contiguous()) != set(ref.experts))
      bad = "token " + std::to_string(n) + ": " + str(set(oe.contiguous())) + ", expected " + str(set(ref.experts));
  }
  Trial t{verdict("experts", bad)};
  if (!bad.empty())
    return t;
  if (ours.weights.scalar_type() != torch::kFloat32)
    t.push_back(verdict("weights dtype", "expected float32"));
  // Weights compared as dense [N, E] maps, so their order within the k is free.
  Tensor dense = torch::zeros({N, E}, ours.weights.options()).scatter(1, ours.experts, ours.weights);
  Tensor denseRef = torch::zeros({N, E}, f64).scatter(1, ref.experts, ref.weights);
  t.push_back({"weights", dense, denseRef});
  backward(t, dense, denseRef, {{"logits", &l}});
  return t;
}

//===-- groupByExpert + groupedLinear, ExpertLinear with LoRA -------------===//

/// "" when \p g groups the routing (experts \p idx [N, k], weights \p wt) by
/// expert with groups padded to \p align; else what is wrong.
std::string groupsProblem(const ExpertGroups &g, const Tensor &idx, const Tensor &wt, int64_t E, int64_t align) {
  if (g.offsets.scalar_type() != torch::kInt32 || g.tokenOfRow.scalar_type() != i64 ||
      g.expertOfRow.scalar_type() != i64 || g.weightOfRow.scalar_type() != torch::kFloat32)
    return "dtypes: expected offsets int32, tokenOfRow/expertOfRow int64, weightOfRow float32";
  Tensor tok = g.tokenOfRow.cpu(), ex = g.expertOfRow.cpu(), w = g.weightOfRow.cpu().to(f64);
  Tensor off = g.offsets.cpu().to(i64), rc = g.rowCounts.cpu(), cnt = g.counts.cpu();
  const int64_t rows = tok.size(0);
  if (off.numel() != E || rc.numel() != E || cnt.numel() != E || ex.size(0) != rows || w.size(0) != rows)
    return "sizes: expected E offsets, rowCounts and counts, and row tensors of one length";
  std::vector<int64_t> counts(E, 0);
  std::vector<std::tuple<int64_t, int64_t, double>> want, got;
  for (int64_t n = 0; n < idx.size(0); ++n)
    for (int64_t j = 0; j < idx.size(1); ++j) {
      int64_t e = idx[n][j].item<int64_t>();
      ++counts[e];
      want.emplace_back(n, e, wt[n][j].item<double>());
    }
  auto num = [](auto v) { return std::to_string(v); };
  int64_t begin = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t end = off[e].item<int64_t>(), n = rc[e].item<int64_t>();
    if (cnt[e].item<int64_t>() != counts[e])
      return "counts[" + num(e) + "] = " + num(cnt[e].item<int64_t>()) + ", expected " + num(counts[e]);
    if (end - begin != n || n < counts[e] || (e + 1 < E && (n % align != 0 || n >= counts[e] + align)))
      return "group " + num(e) + " spans rows [" + num(begin) + ", " + num(end) + ") for " + num(counts[e]) +
             " tokens, alignment " + num(align);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t rt = tok[r].item<int64_t>(), re = ex[r].item<int64_t>();
      const double rw = w[r].item<double>();
      if (re != e)
        return "row " + num(r) + " of group " + num(e) + " says expert " + num(re);
      if (rw != 0.0)
        got.emplace_back(rt, e, rw);
      else if (rt != 0)
        return "padding row " + num(r) + " holds token " + num(rt) + ", expected 0";
    }
    begin = end;
  }
  if (begin != rows)
    return "offsets end at row " + num(begin) + " of " + num(rows);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  return want == got ? "" : "rows do not hold exactly the routed (token, expert, weight) triples";
}

/// Tokens, experts, k, widths, row alignment; `idle`: an expert no token
/// picks; rank > 0: ExpertLinear with LoRA (PEFT layout, or peftSwapped);
/// bias: ExpertLinear's [E, out] bias.
struct ExpertCase {
  int64_t N, E, k, in, out, align, idle = -1, rank = 0;
  bool swapped = false, bias = false;
};

/// The MoE combine y_n = sum_j w_nj ((W_e + s B_e A_e) x_n + b_e) through
/// groupByExpert, dispatchTokens, grouped GEMMs and combineExpertRows, against a per-token
/// loop in double.
Trial expertTrial(const Ctx &c, const ExpertCase &x) {
  const bool lora = x.rank > 0;
  const int64_t r = std::max<int64_t>(x.rank, 1);
  Input in = input(c, torch::randn({x.N, x.in}, f64), true);
  Input w = input(c, torch::randn({x.E, x.out, x.in}, f64) / std::sqrt(double(x.in)), !lora);
  Input wt = input(c, torch::rand({x.N, x.k}, f64) * 0.75 + 0.25, true, torch::kFloat32);
  std::vector<Tensor> picks; // k distinct experts per token, never the idle one
  for (int64_t n = 0; n < x.N; ++n) {
    Tensor p = torch::randperm(x.idle >= 0 ? x.E - 1 : x.E, i64).narrow(0, 0, x.k);
    picks.push_back(x.idle >= 0 ? p + (p >= x.idle).to(i64) : p);
  }
  Tensor idx = torch::stack(picks);
  // PEFT-layout factors, fp32 masters holding values of the tested dtype:
  // A [E*r, in] and B [out, r*E]; swapped, A [E*r, out] and B [in, r*E].
  Input A = input(c, torch::randn({x.E * r, x.swapped ? x.out : x.in}, f64) * 0.5, lora, torch::kFloat32);
  Input Bm = input(c, torch::randn({x.swapped ? x.in : x.out, r * x.E}, f64) * 0.5, lora, torch::kFloat32);
  Input bias = input(c, torch::randn({x.E, x.out}, f64), false);

  ExpertGroups g = groupByExpert(Routing{idx.to(c.device), wt.ours}, x.E, x.align);
  Trial t{verdict("groups", groupsProblem(g, idx, wt.ref, x.E, x.align))};
  Tensor rows = dispatchTokens(in.ours, g), y;
  if (lora || x.bias) {
    ExpertLinear lin{w.ours, x.bias ? bias.ours : Tensor(), lora ? A.ours : Tensor(), lora ? Bm.ours : Tensor(), 1.5};
    lin.peftSwapped = x.swapped;
    y = lin.forward(rows, g);
  } else {
    y = groupedLinear(rows, w.ours, g);
  }
  Tensor ours = combineExpertRows(y, g, wt.ours);

  // Reference: effective per-expert weights, then a loop over tokens.
  std::vector<Tensor> eff;
  for (int64_t e = 0; e < x.E; ++e) {
    Tensor we = w.ref.select(0, e);
    if (lora) {
      std::vector<int64_t> cols; // PEFT: rows e*r + k of lora_A, columns k*E + e of lora_B
      for (int64_t kk = 0; kk < x.rank; ++kk)
        cols.push_back(kk * x.E + e);
      Tensor Ae = A.ref.narrow(0, e * x.rank, x.rank), Be = Bm.ref.index_select(1, indices(cols));
      // Unswapped: delta[o, i] = sum_k B[o, kE+e] A[er+k, i]. Swapped (PEFT
      // sees the expert as [in, out]): delta[o, i] = sum_k A[er+k, o] B[i, kE+e].
      we = we + 1.5 * (x.swapped ? torch::matmul(Ae.t(), Be.t()) : torch::matmul(Be, Ae));
    }
    eff.push_back(we);
  }
  std::vector<Tensor> tokens;
  for (int64_t n = 0; n < x.N; ++n) {
    Tensor acc = torch::zeros({x.out}, f64);
    for (int64_t j = 0; j < x.k; ++j) {
      const int64_t e = idx[n][j].item<int64_t>();
      acc = acc + wt.ref[n][j] * (torch::mv(eff[e], in.ref[n]) + (x.bias ? bias.ref[e] : torch::zeros({1}, f64)));
    }
    tokens.push_back(acc);
  }
  Tensor ref = torch::stack(tokens);
  t.push_back({"out", ours, ref});
  backward(t, ours, ref,
           lora ? std::vector<std::pair<std::string, Input *>>{{"x", &in}, {"lora_A", &A}, {"lora_B", &Bm}, {"weights", &wt}}
                : std::vector<std::pair<std::string, Input *>>{{"x", &in}, {"w", &w}, {"weights", &wt}});
  return t;
}

/// The groupedLinear path a product with weights [E, n, kdim] should take:
/// the grouped GEMM for fp32/bf16 on CPU and bf16 on CUDA, with 16-byte rows.
std::string gemmPath(int64_t n, int64_t kdim, torch::ScalarType dtype, torch::Device device) {
  const int64_t bytes = dtype == torch::kFloat32 ? 4 : 2;
  const bool kernel = device.is_cpu() || dtype == torch::kBFloat16;
  return kernel && (n * bytes) % 16 == 0 && (kdim * bytes) % 16 == 0 ? "grouped_mm" : "loop";
}

//===-- gatedActivation ---------------------------------------------------===//

Trial gatedTrial(const Ctx &c, int64_t N, int64_t I, bool interleaved, bool clamped) {
  Input gu = input(c, torch::randn({N, 2 * I}, f64) * (clamped ? 5.0 : 1.5), true);
  FfnDef f;
  f.act = clamped ? ExpertAct::ClampedSwiGLU : ExpertAct::SwiGLU, f.swigluAlpha = 1.702, f.swigluLimit = 7.0;
  Tensor ours = gatedActivation(gu.ours, interleaved, f);
  std::vector<int64_t> gi, ui;
  for (int64_t i = 0; i < I; ++i) {
    gi.push_back(interleaved ? 2 * i : i);
    ui.push_back(interleaved ? 2 * i + 1 : I + i);
  }
  Tensor gate = gu.ref.index_select(1, indices(gi)), up = gu.ref.index_select(1, indices(ui)), ref;
  Trial t;
  if (clamped) {
    const double L = f.swigluLimit;
    if ((gate.detach() > L).sum().item<int64_t>() + (up.detach().abs() > L).sum().item<int64_t>() == 0)
      t.push_back(verdict("clamping exercised", "no input beyond the limit"));
    Tensor g = torch::where(gate > L, torch::full_like(gate, L), gate);
    Tensor u = torch::where(up > L, torch::full_like(up, L), torch::where(up < -L, torch::full_like(up, -L), up));
    ref = (u + 1.0) * g / (1.0 + torch::exp(-f.swigluAlpha * g));
  } else {
    ref = gate / (1.0 + torch::exp(-gate)) * up;
  }
  t.push_back({"out", ours, ref});
  backward(t, ours, ref, {{"gate_up", &gu}});
  return t;
}

//===-- the registry, runner and records ----------------------------------===//

struct Result {
  std::string id, dtype, shape;
  int64_t seed;
  double forward = 0, backward = 0, tolerance = 0;
  bool pass = false;
  std::string worst;
  double seconds = 0; ///< The trial's wall time (our op, the reference and the comparison).
};

uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s)
    h = (h ^ ch) * 1099511628211ull;
  return h;
}

const char *dtypeName(torch::ScalarType t) { return t == torch::kFloat32 ? "float32" : "bfloat16"; }

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

Result runTrial(const Check &check, torch::ScalarType dtype, torch::Device device, int64_t seed) {
  Result r{check.id, dtypeName(dtype), check.shape + (check.note ? check.note(dtype, device) : ""), seed};
  // Grounds (docs/validation.md#numerical-bounds): float32 worst measured
  // 1.1e-6 (the chunked delta rules' backward), 1e-5 is 8.8x; bfloat16 rounds
  // inputs and each op's output at 2^-8 = 3.9e-3, measured worst 7.6e-3
  // (vision position interpolation's backward), 2.5e-2 is 3.3x. A wrong op
  // (the self-test's RoPE layout) is off by O(1).
  r.tolerance = dtype == torch::kFloat32 ? 1e-5 : 2.5e-2;
  // Inputs depend on the check, shape and seed only (not on --only or order).
  Ctx c{dtype, device, fnv1a(check.id + "|" + check.shape) ^ (uint64_t(seed + 1) * 0x9E3779B97F4A7C15ull)};
  torch::manual_seed(c.seed & 0x7fffffffffffffffull);
  Trial trial;
  try {
    trial = check.run(c);
  } catch (const std::exception &e) {
    std::string what = e.what();
    trial = {verdict("exception", "threw: " + what.substr(0, what.find('\n')))};
  }
  double worst = -1;
  for (const Item &item : trial) {
    auto [err, where] = item.error >= 0 ? std::make_pair(item.error, item.where) : measure(item.ours, item.ref);
    if (item.name == "out" && item.ours.defined() && item.ours.scalar_type() != dtype) {
      err = kInf;
      where = std::string("dtype ") + c10::toString(item.ours.scalar_type()) + ", expected " + dtypeName(dtype);
    }
    double &slot = item.backward ? r.backward : r.forward;
    slot = std::max(slot, err);
    if (err > worst) {
      worst = err;
      r.worst = item.name + " " + where;
    }
  }
  r.pass = !trial.empty() && r.forward <= r.tolerance && r.backward <= r.tolerance;
  return r;
}

std::vector<Check> registry() {
  std::vector<Check> all;
  auto add = [&](std::string id, std::string shape, std::function<Trial(const Ctx &)> fn, Note note = {}) {
    addCheck(all, std::move(id), std::move(shape), std::move(fn), std::move(note));
  };
  auto S = shapeText;
  using Shapes = std::vector<std::array<int64_t, 3>>;

  for (bool weight : {true, false})
    // 24 and 520 fit the CUDA kernel's 16-byte packs (one and three per lane).
    for (auto [B, T, D] : Shapes{{2, 7, 10}, {1, 13, 17}, {2, 7, 24}, {2, 5, 520}})
      add(weight ? "rms_norm.weight" : "rms_norm.weightless", S({{"B", B}, {"T", T}, {"D", D}}),
          [=](const Ctx &c) { return rmsNormTrial(c, B, T, D, weight); });
  // The residual stream's norms: 24, 520 and 2,048 (Qwen3-30B-A3B's hidden)
  // fit the kernels' packs, 17 stays on the composition.
  for (bool branch : {true, false})
    for (bool zeroCentred : {false, true})
      for (auto [B, T, D] : Shapes{{2, 7, 24}, {1, 13, 17}, {2, 5, 520}, {1, 6, 2048}})
        add(std::string("norm.residual_rms") + (branch ? "" : ".stream_only") + (zeroCentred ? ".zero_centred" : ""),
            S({{"B", B}, {"T", T}, {"D", D}}),
            [=](const Ctx &c) { return residualRmsNormTrial(c, B, T, D, branch, zeroCentred); });

  // RoPE on x [2, 3, T, D]; shapes are (T, D, rotaryDim).
  auto rope = [&](const std::string &id, RopeDef r, const Shapes &shapes, bool strided = false) {
    for (auto [T, D, rot] : shapes) {
      r.rotaryDim = rot;
      add(id, S({{"B", 2}, {"H", 3}, {"T", T}, {"D", D}, {"rot", rot}, {"theta", int64_t(r.theta)}}),
          [=](const Ctx &c) { return ropeTrial(c, T, D, r, r.interleaved, strided); });
    }
  };
  auto def = [](bool interleaved, const char *scaling, double theta, double factor = 1.0, int64_t original = 0) {
    RopeDef r;
    r.interleaved = interleaved, r.scaling = scaling, r.theta = theta, r.factor = factor;
    r.originalMaxPositions = original;
    return r;
  };
  const Shapes full{{7, 16, 16}, {13, 24, 24}}, partial{{13, 24, 16}, {7, 17, 10}};
  rope("rope.half", def(false, "", 10000), full);
  rope("rope.interleaved", def(true, "", 10000), full);
  rope("rope.partial.half", def(false, "", 10000), partial);
  rope("rope.partial.interleaved", def(true, "", 10000), partial);
  // D 32 / rot 32 strided: the CUDA kernel's 16-byte packs over [B, T, H, D] strides.
  rope("rope.half.strided", def(false, "", 10000), {{13, 24, 24}, {7, 17, 10}, {7, 32, 32}}, true);
  rope("rope.interleaved.strided", def(true, "", 10000), {{13, 24, 16}}, true);
  // YaRN: factor 4 over 16 original positions; theta 100 puts the ramp inside
  // these small rotary dims. Forms: plain (attention factor from factor alone),
  // DeepSeek (mscale 1 / mscaleAllDim 1, interleaved), a ratio (1 / 0.5).
  for (bool truncate : {true, false})
    for (int form = 0; form < 3; ++form) {
      RopeDef r = def(form == 1, "yarn", 100, 4, 16);
      r.betaFast = 32, r.betaSlow = 1, r.truncate = truncate;
      r.mscale = 1.0, r.mscaleAllDim = form == 0 ? 0.0 : form == 1 ? 1.0 : 0.5;
      const char *forms[] = {"rope.yarn", "rope.yarn.deepseek", "rope.yarn.mscale_ratio"};
      rope(std::string(forms[form]) + (truncate ? ".truncate" : ".no_truncate"), r,
           {{13, 16, 16}, {7, 24, 24}, {13, 24, 16}});
    }
  RopeDef llama3 = def(false, "llama3", 100, 8, 16);
  llama3.lowFreqFactor = 1, llama3.highFreqFactor = 4;
  rope("rope.llama3", llama3, {{13, 16, 16}, {7, 24, 24}});
  llama3.theta = 10000;
  rope("rope.llama3", llama3, {{13, 24, 24}});

  auto attn = [&](const char *id, AttnCase a) {
    std::string shape = S({{"B", 2}, {"H", a.H}, {"KV", a.KV}, {"T", a.T}, {"Dq", a.Dq}, {"Dv", a.Dv}});
    shape += (a.scale > 0 ? " scale" + fmt(a.scale) : "") + (a.window ? " window" + std::to_string(a.window) : "") +
             (a.chunk ? " chunk" + std::to_string(a.chunk) : "");
    add(id, shape, [=](const Ctx &c) { return attentionTrial(c, a); });
  };
  attn("attention.causal", {3, 3, 7, 16, 16});
  attn("attention.causal", {3, 3, 13, 24, 24});
  attn("attention.causal", {3, 3, 67, 16, 16});
  attn("attention.scale", {3, 3, 13, 10, 10, 0.37});
  attn("attention.window", {3, 3, 13, 16, 16, 0, 4});
  attn("attention.window", {6, 2, 7, 10, 10, 0, 4});
  attn("attention.window", {6, 2, 67, 16, 16, 0, 17});
  attn("attention.chunked", {3, 3, 13, 16, 16, 0, 0, 5});
  attn("attention.chunked", {3, 1, 7, 24, 24, 0, 0, 5});
  attn("attention.chunked", {3, 1, 67, 16, 16, 0, 0, 29});
  attn("attention.gqa", {6, 2, 13, 16, 16});
  attn("attention.gqa", {3, 1, 7, 17, 17});
  attn("attention.mla", {3, 3, 13, 24, 16, 0.3});
  attn("attention.sinks", {3, 3, 13, 16, 16, 0, 0, 0, true});
  attn("attention.sinks", {6, 2, 7, 16, 16, 0, 0, 0, true});
  attn("attention.sinks", {6, 2, 67, 16, 16, 0, 0, 0, true});
  attn("attention.sinks_window", {6, 2, 13, 16, 16, 0.3, 4, 0, true});
  attn("attention.sinks_chunked", {3, 1, 13, 24, 16, 0, 0, 5, true});

  // Routers; shapes are (N tokens, E experts, k).
  auto router = [&](const char *id, RouterKind kind, bool norm, double scaling, bool bias, int64_t groups,
                    const Shapes &shapes) {
    for (auto [N, E, k] : shapes) {
      FfnDef f;
      f.router = kind, f.experts = E, f.topK = k, f.normTopK = norm, f.routedScaling = scaling;
      f.groups = groups, f.topKGroups = groups > 1 ? 2 : 1;
      add(id, S({{"N", N}, {"E", E}, {"k", k}}) + (groups > 1 ? " groups" + std::to_string(groups) + "/2" : ""),
          [=](const Ctx &c) { return routeTrial(c, N, E, f, bias); });
    }
  };
  const Shapes rs{{13, 8, 2}, {7, 5, 3}};
  router("route.softmax_topk", RouterKind::SoftmaxTopK, false, 1.0, false, 1, rs);
  // 128 and 256 experts: several per lane of the GPU's warp-per-token kernel. (Not sigmoid: the
  // scores of that many separated logits saturate near 1, and their normalised weights' gradient
  // cancels to ~2e-6 in fp32, too close to the bound.)
  router("route.softmax_topk.norm_scaled", RouterKind::SoftmaxTopK, true, 1.5, false, 1,
         {{13, 8, 2}, {7, 5, 3}, {64, 128, 8}, {64, 256, 8}});
  router("route.sigmoid_topk.norm_scaled", RouterKind::SigmoidTopK, true, 2.5, false, 1, rs);
  router("route.sigmoid_topk.bias", RouterKind::SigmoidTopK, false, 1.0, true, 1, rs);
  router("route.sigmoid_topk.bias_groups", RouterKind::SigmoidTopK, true, 2.5, true, 4, {{13, 8, 2}, {7, 12, 3}});
  router("route.sigmoid_topk.groups", RouterKind::SigmoidTopK, true, 2.5, false, 4, {{13, 8, 3}});
  router("route.topk_softmax", RouterKind::TopKSoftmax, false, 1.0, false, 1, rs);
  router("route.topk_sigmoid_input", RouterKind::TopKSigmoidInput, false, 1.0, false, 1, rs);

  auto expert = [&](const std::string &id, ExpertCase e) {
    std::string shape = S({{"N", e.N}, {"E", e.E}, {"k", e.k}, {"in", e.in}, {"out", e.out}, {"align", e.align}});
    shape += (e.rank ? " r" + std::to_string(e.rank) : "") + (e.idle >= 0 ? " idle" + std::to_string(e.idle) : "");
    add(id, shape, [=](const Ctx &c) { return expertTrial(c, e); }, [=](torch::ScalarType t, torch::Device d) {
      return " [" + gemmPath(e.out, e.in, t, d) +
             (e.rank ? ", A " + gemmPath(e.rank, e.in, t, d) + ", B " + gemmPath(e.out, e.rank, t, d) : "") + "]";
    });
  };
  for (int64_t align : {1, 16}) {
    std::string id = "grouped_linear.align" + std::to_string(align);
    expert(id, {13, 5, 2, 24, 16, align});
    expert(id, {7, 8, 2, 17, 10, align});
    expert(id, {13, 8, 3, 12, 8, align, 3});
    expert(id, {61, 8, 2, 24, 16, align});
  }
  for (bool swapped : {false, true}) {
    std::string id = swapped ? "expert_lora.peft_swapped" : "expert_lora.peft";
    expert(id, {13, 5, 2, 24, 16, 1, -1, 4, swapped});
    expert(id, {7, 8, 3, 17, 10, 16, 2, 4, swapped});
    expert(id, {13, 5, 2, 24, 16, 16, -1, 8, swapped});
    // Rank 16 over several 16-row tiles: the fused grouped-GEMM + LoRA node on CUDA.
    expert(id, {45, 6, 3, 32, 40, 16, 4, 16, swapped});
  }
  // The low-rank kernel at rank 32, and at rank 16 over unaligned groups,
  // whose tiles mix experts.
  expert("expert_lora.peft", {45, 6, 3, 32, 40, 16, -1, 32, false});
  expert("expert_lora.peft", {45, 6, 3, 32, 40, 1, -1, 16, false});
  expert("expert_lora.peft_bias", {13, 5, 2, 24, 16, 1, -1, 4, false, true});
  expert("expert_linear.bias", {7, 5, 2, 17, 10, 16, -1, 0, false, true});

  for (bool clamped : {false, true})
    for (bool interleaved : {false, true})
      // 24 and 136 fit the CUDA kernel's 16-byte packs.
      for (auto [N, I] : std::vector<std::array<int64_t, 2>>{{7, 10}, {13, 17}, {9, 24}, {5, 136}})
        add(std::string(clamped ? "clamped_swiglu" : "swiglu") + (interleaved ? ".interleaved" : ".concat"),
            S({{"N", N}, {"I", I}}), [=](const Ctx &c) { return gatedTrial(c, N, I, interleaved, clamped); });
  addLinearAttentionChecks(all);
  addSparseAttentionChecks(all);
  addVisionChecks(all);
  addLightningChecks(all);
  addLossChecks(all);
  addFusedExpertChecks(all);
  addRouterLogitsChecks(all);
  addLoraLinearChecks(all);
  return all;
}

int usage(const std::string &message) {
  std::fprintf(stderr,
               "error: %s\nusage: adapt-op-check --out DIR [--seeds N] [--device cpu|cuda] [--only SUBSTRING]\n"
               "       adapt-op-check --self-test [--seeds N] [--device cpu|cuda]\n",
               message.c_str());
  return 2;
}

/// --self-test: the interleaved op against a half-rotation reference (pairs
/// i, i + d/2): a deliberately wrong reference every seed must FAIL.
int selfTest(torch::Device device, int64_t seeds) {
  RopeDef r;
  r.interleaved = true, r.rotaryDim = 16;
  Check broken{"self-test.rope.interleaved-vs-half", "B2 H3 T13 D16 rot16",
               [r](const Ctx &c) { return ropeTrial(c, 13, 16, r, /*refInterleaved=*/false); }};
  int64_t failures = 0;
  double worst = 0;
  for (int64_t s = 0; s < seeds; ++s) {
    Result res = runTrial(broken, torch::kFloat32, device, s);
    failures += !res.pass;
    worst = std::max(worst, res.forward);
  }
  const bool caught = failures == seeds;
  std::printf("self-test: applyRope(interleaved) checked against a half-rotation reference (pairs i, i+d/2),\n"
              "  float32 on %s, %lld seeds: %lld FAIL (worst forward error %s, tolerance 1.00e-05)\n"
              "self-test %s: the checker %s a wrong rotation layout\n",
              device.str().c_str(), (long long)seeds, (long long)failures, fmt(worst).c_str(),
              caught ? "passed" : "FAILED", caught ? "catches" : "MISSES");
  return caught ? 0 : kExitCheckFailed;
}

} // namespace

int main(int argc, char **argv) {
  std::string outDir, only, deviceName, precision;
  int64_t seeds = 0;
  bool self = false;
  try {
    const ParsedFlags flags = parseFlags(
        argc, argv, {{"--out", "--only", "--device", "--seeds", "--dtype"}, {"--self-test", "--help", "-h"}, {}});
    if (flags.has("--help") || flags.has("-h")) {
      std::printf("adapt-op-check --out DIR [--seeds N] [--device cpu|cuda] [--only SUBSTRING]\n"
                  "               [--dtype both|float32|bfloat16] | --self-test\n"
                  "Checks every op of runtime/Ops.h against float64 references (float32 and bfloat16, or the one\n"
                  "--dtype names; forward and backward); writes DIR/op-stage.json and DIR/op-stage.md, with each\n"
                  "check's wall time.\n"
                  "Exit codes: 0 all passed, 4 a check failed, 2 bad usage, 1 internal error.\n");
      return 0;
    }
    self = flags.has("--self-test");
    outDir = flags.text("--out");
    only = flags.text("--only");
    deviceName = flags.choice("--device", "cpu", {"cpu", "cuda"});
    precision = flags.choice("--dtype", "both", {"both", "float32", "bfloat16"});
    seeds = flags.integer("--seeds", 5, 1, 1000);
  } catch (const RuntimeError &e) {
    return usage(e.what());
  }
  if (outDir.empty() && !self)
    return usage("--out DIR is required");
  try {
    if (deviceName == "cuda" && !torch::cuda::is_available()) {
      std::fprintf(stderr, "error: --device cuda: this LibTorch sees no CUDA device\n");
      return 2;
    }
    const torch::Device device(deviceName == "cuda" ? torch::kCUDA : torch::kCPU);
    if (self)
      return selfTest(device, seeds);
    std::vector<Check> checks;
    for (Check &c : registry())
      if (c.id.find(only) != std::string::npos)
        checks.push_back(std::move(c));
    if (checks.empty())
      return usage("--only " + only + ": no check id contains it");

    // One line per check, dtype and shape: the worst over seeds.
    std::vector<Result> results;
    int64_t lines = 0, failed = 0;
    std::ostringstream table;
    std::printf("%-36s %-8s %-50s %9s %9s  %-6s %s\n", "check", "dtype", "shape", "worst", "tolerance", "result",
                "seconds");
    std::vector<torch::ScalarType> dtypes;
    if (precision != "bfloat16")
      dtypes.push_back(torch::kFloat32);
    if (precision != "float32")
      dtypes.push_back(torch::kBFloat16);
    for (const Check &check : checks)
      for (torch::ScalarType dtype : dtypes) {
        double worst = -1, seconds = 0;
        bool ok = true;
        std::string where;
        for (int64_t s = 0; s < seeds; ++s) {
          const auto start = std::chrono::steady_clock::now();
          Result r = runTrial(check, dtype, device, s);
          r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          seconds += r.seconds;
          if (double e = std::max(r.forward, r.backward); e > worst) {
            worst = e;
            where = "seed " + std::to_string(s) + ": " + r.worst;
          }
          ok &= r.pass;
          results.push_back(r);
        }
        const Result &last = results.back();
        ++lines;
        failed += !ok;
        std::printf("%-36s %-8s %-50s %9s %9s  %-6s %.2f\n", check.id.c_str(), last.dtype.c_str(),
                    last.shape.c_str(), fmt(worst).c_str(), fmt(last.tolerance).c_str(), ok ? "pass" : "FAIL", seconds);
        if (!ok)
          std::printf("    worst at %s\n", where.c_str());
        std::fflush(stdout);
        table << "| " << check.id << " | " << last.dtype << " | " << last.shape << " | " << fmt(worst) << " | "
              << fmt(last.tolerance) << " | " << (ok ? "pass" : "**FAIL**") << " | " << where << " |\n";
      }
    const bool passed = failed == 0;

    // Records: JSON for tools, Markdown for people.
    JsonValue list = JsonValue::array(), seedList = JsonValue::array();
    for (int64_t s = 0; s < seeds; ++s)
      seedList.push(s);
    for (const Result &r : results)
      list.push(JsonValue::object({{"id", r.id}, {"dtype", r.dtype}, {"shape", r.shape}, {"seed", r.seed},
                                   {"forward_error", r.forward}, {"backward_error", r.backward},
                                   {"tolerance", r.tolerance}, {"pass", r.pass}, {"worst_index", r.worst},
                                   {"seconds", r.seconds}}));
    const std::string lib = ADAPT_RUNTIME_LIBRARY, exe = canonicalPath("/proc/self/exe");
    JsonValue record = JsonValue::object({
        {"stage", "op"},
        {"passed", passed},
        {"device", deviceName},
        {"seeds", std::move(seedList)},
        {"only", only},
        {"dtype", precision},
        {"torch", TORCH_VERSION},
        {"metric", "||ours - ref|| / ||ref|| over every element; non-finite, wrong shape or dtype: infinite"},
        {"code", JsonValue::object({{"runtime_library", lib},
                                    {"sha256", isRegularFile(lib) ? sha256File(lib) : std::string("missing")},
                                    {"executable", exe},
                                    {"executable_sha256", sha256File(exe)}})},
        {"checks", std::move(list)},
    });
    createDirectories(outDir);
    writeFileAtomic(joinPath(outDir, "op-stage.json"), record.dump(2) + "\n");
    std::ostringstream md;
    md << "# Op stage: " << (passed ? "passed" : "FAILED") << "\n\n"
       << "Every op variant of `runtime/Ops.h` (and `ExpertLinear` with LoRA) against a float64 reference on "
       << deviceName << ", " << seeds << " seeds, forward and backward (one random cotangent). Error: "
       << "||ours - ref|| / ||ref|| over every element, the worst of the output and all gradients over the seeds; "
       << "tolerance 1e-5 (float32) and 2.5e-2 (bfloat16, inputs rounded first). `[grouped_mm]`/`[loop]`: the "
       << "groupedLinear path of the base weight (and LoRA A, B).\n\n"
       << "Library `" << lib << "`, torch " << TORCH_VERSION << ".\n\n"
       << "| check | dtype | shape | worst error | tolerance | result | worst element |\n"
       << "|---|---|---|---:|---:|---|---|\n"
       << table.str();
    writeFileAtomic(joinPath(outDir, "op-stage.md"), md.str());
    std::printf("%lld checks x %lld seeds (%zu trials): %s\n", (long long)lines, (long long)seeds, results.size(),
                passed ? "all passed" : (std::to_string(failed) + " FAILED").c_str());
    return passed ? 0 : kExitCheckFailed;
  } catch (const RuntimeError &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exitCode;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
