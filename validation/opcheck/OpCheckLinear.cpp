//===- OpCheckLinear.cpp - op-stage checks: linear attention (gated delta rule, Kimi delta, lightning) ===//
//
// Checks of linear attention (gated delta rule, Kimi delta, lightning) against float64 references written here.
// The references are the definitions, token by token: the state update
// S_t = (I - b_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T as matrix
// products, the convolution as a sum over the window, the norms as formulas.
//
//===----------------------------------------------------------------------===//

#include "validation/opcheck/OpCheckHarness.h"

#include "runtime/KimiDeltaFunction.h"
#include "runtime/LinearAttention.h"
#include "runtime/Ops.h"

namespace adapt::rt::opcheck {

namespace {

/// The gated delta rule in float64, one token at a time, for q, k [B, H, T,
/// dk], v [B, H, T, dv], g [B, H, T] or [B, H, T, dk], beta [B, H, T].
Tensor refDeltaRule(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta) {
  const int64_t B = k.size(0), H = k.size(1), T = k.size(2), dk = k.size(3), dv = v.size(3);
  const double scale = 1.0 / std::sqrt(double(dk));
  Tensor eye = torch::eye(dk, f64);
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Tensor> heads;
    for (int64_t h = 0; h < H; ++h) {
      Tensor S = torch::zeros({dk, dv}, f64);
      std::vector<Tensor> outs;
      for (int64_t t = 0; t < T; ++t) {
        Tensor kt = k[b][h][t].unsqueeze(1), vt = v[b][h][t].unsqueeze(1), qt = q[b][h][t].unsqueeze(1);
        Tensor decay = g.dim() == 4 ? torch::diag(torch::exp(g[b][h][t])) : torch::exp(g[b][h][t]) * eye;
        Tensor bt = beta[b][h][t];
        S = torch::matmul(eye - bt * torch::matmul(kt, kt.t()), torch::matmul(decay, S)) + bt * torch::matmul(kt, vt.t());
        outs.push_back(torch::matmul(S.t(), qt).squeeze(1) * scale);
      }
      heads.push_back(torch::stack(outs));
    }
    rows.push_back(torch::stack(heads));
  }
  return torch::stack(rows);
}

struct DeltaCase {
  int64_t H, T, dk, dv, chunk;
  bool perChannel = false;
  bool recurrent = false; ///< Check the recurrent form instead of the chunked one.
  int64_t segment = 0;    ///< >0: the segmented (recomputed) form with this segment length.
  bool noGrad = false;    ///< The forward alone, without a graph (bf16 on a GPU: the forward kernels).
};

Trial deltaRuleTrial(const Ctx &c, const DeltaCase &d) {
  const int64_t B = 2;
  // Unit keys and queries, as the layers feed them (l2-normalised).
  auto unit = [](Tensor x) { return x / x.norm(2, -1, true); };
  Input q = input(c, unit(torch::randn({B, d.H, d.T, d.dk}, f64)), true);
  Input k = input(c, unit(torch::randn({B, d.H, d.T, d.dk}, f64)), true);
  Input v = input(c, torch::randn({B, d.H, d.T, d.dv}, f64), true);
  std::vector<int64_t> gShape = {B, d.H, d.T};
  if (d.perChannel)
    gShape.push_back(d.dk);
  // Log decays spread over (-3, 0): some strong, some close to 1.
  Input g = input(c, -torch::nn::functional::softplus(torch::randn(gShape, f64) * 1.5 - 1.0), true);
  Input beta = input(c, torch::sigmoid(torch::randn({B, d.H, d.T}, f64)), true);
  DeltaRuleInputs in{q.ours, k.ours, v.ours, g.ours, beta.ours};
  if (d.noGrad) {
    torch::NoGradGuard noGrad;
    return {{"out", gatedDeltaRuleChunked(in, d.chunk), refDeltaRule(q.ref, k.ref, v.ref, g.ref, beta.ref)}};
  }
  Tensor ours = d.recurrent     ? gatedDeltaRuleRecurrent(in)
                : d.segment > 0 ? gatedDeltaRuleSegmented(in, d.chunk, d.segment)
                                : gatedDeltaRuleChunked(in, d.chunk);
  Tensor ref = refDeltaRule(q.ref, k.ref, v.ref, g.ref, beta.ref);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"q", &q}, {"k", &k}, {"v", &v}, {"g", &g}, {"beta", &beta}});
  return t;
}

/// Causal depthwise convolution + SiLU in float64, summing the window.
Tensor refConv(const Tensor &x, const Tensor &w) {
  const int64_t T = x.size(1), K = w.size(1);
  std::vector<Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    Tensor acc = torch::zeros({x.size(0), x.size(2)}, f64);
    for (int64_t j = 0; j < K; ++j) {
      int64_t src = t - (K - 1) + j;
      if (src >= 0)
        acc = acc + x.select(1, src) * w.select(1, j);
    }
    outs.push_back(acc * torch::sigmoid(acc));
  }
  return torch::stack(outs, 1);
}

Trial convTrial(const Ctx &c, int64_t T, int64_t C, int64_t K) {
  Input x = input(c, torch::randn({2, T, C}, f64), true);
  Input w = input(c, torch::randn({C, K}, f64) * 0.5, true);
  Tensor ours = causalConv1dSilu(x.ours, w.ours.unsqueeze(1));
  Tensor ref = refConv(x.ref, w.ref);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}, {"w", &w}});
  return t;
}

Tensor refRms(const Tensor &x, double eps) { return x / torch::sqrt(x.pow(2).mean(-1, true) + eps); }

Trial gatedNormTrial(const Ctx &c, int64_t N, int64_t D) {
  Input x = input(c, torch::randn({N, D}, f64), true);
  Input z = input(c, torch::randn({N, D}, f64), true);
  Input w = input(c, torch::randn({D}, f64) * 0.1 + 1.0, true);
  Tensor ours = gatedRmsNorm(x.ours, w.ours, z.ours, 1e-6);
  Tensor ref = refRms(x.ref, 1e-6) * w.ref * z.ref * torch::sigmoid(z.ref);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}, {"z", &z}, {"w", &w}});
  return t;
}

Trial sigmoidGatedNormTrial(const Ctx &c, int64_t N, int64_t D) {
  Input x = input(c, torch::randn({N, D}, f64), true);
  Input z = input(c, torch::randn({N, D}, f64), true);
  Input w = input(c, torch::randn({D}, f64) * 0.1 + 1.0, true);
  Tensor ours = sigmoidGatedRmsNorm(x.ours, w.ours, z.ours, 1e-5);
  Tensor ref = refRms(x.ref, 1e-5) * w.ref * torch::sigmoid(z.ref);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}, {"z", &z}, {"w", &w}});
  return t;
}

Trial zeroCentredTrial(const Ctx &c, int64_t N, int64_t D) {
  Input x = input(c, torch::randn({N, D}, f64), true);
  Input w = input(c, torch::randn({D}, f64) * 0.1, true);
  Tensor ours = zeroCentredRmsNorm(x.ours, w.ours, 1e-6);
  Tensor ref = refRms(x.ref, 1e-6) * (1.0 + w.ref);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}, {"w", &w}});
  return t;
}

Trial l2Trial(const Ctx &c, int64_t N, int64_t D) {
  Input x = input(c, torch::randn({N, D}, f64), true);
  Tensor ours = l2Normalize(x.ours, 1e-6);
  Tensor ref = x.ref / torch::sqrt(x.ref.pow(2).sum(-1, true) + 1e-6);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}});
  return t;
}

/// The delta rule's use of l2Normalize (deltaInputs): q or k as a view of
/// the convolution's output (its heads' rows strided by every channel), the
/// result transposed to [B, H, T, D], so the gradient arrives strided too.
/// On a GPU with ADAPT_L2NORM_KERNEL=1 the kernels read both in place.
Trial l2StridedTrial(const Ctx &c, int64_t B, int64_t T, int64_t H, int64_t D) {
  Input mixed = input(c, torch::randn({B, T, 3 * H * D}, f64), true);
  auto heads = [&](const Tensor &m) { return m.narrow(-1, H * D, H * D).view({B, T, H, D}); };
  Tensor ours = l2Normalize(heads(mixed.ours), 1e-6).transpose(1, 2);
  Tensor r = heads(mixed.ref);
  Tensor ref = (r / torch::sqrt(r.pow(2).sum(-1, true) + 1e-6)).transpose(1, 2);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"mixed", &mixed}});
  return t;
}

/// Kimi's per-channel decayed scores alone, P[t][i] = sum_d x_td y_id
/// e^{G_td - G_id} (i <= t), and the backward written for them (dx, dy), at
/// chunk shapes [B, H, n, c, dk], against float64 pairs and autograd: on a
/// GPU with ADAPT_KIMI_SCORES_KERNEL=1 these are the kernels'. The inputs
/// hold the tested dtype's values stored in fp32, as the node's chunks do,
/// so the scores come out fp32 in both precisions (compared as "scores":
/// the harness asks "out" for the tested dtype); G is a cumulative sum of
/// log decays down each chunk.
Trial kimiScoresTrial(const Ctx &c, int64_t B, int64_t H, int64_t n, int64_t chunk, int64_t dk) {
  Input x = input(c, torch::randn({B, H, n, chunk, dk}, f64), true, torch::kFloat32);
  Input y = input(c, torch::randn({B, H, n, chunk, dk}, f64), true, torch::kFloat32);
  Input cum = input(c, torch::log_sigmoid(torch::randn({B, H, n, chunk, dk}, f64) + 2.0).cumsum(3), false,
                    torch::kFloat32);
  Tensor ours = perChannelDecayedScores(x.ours, y.ours, cum.ours);
  Tensor exponent = cum.ref.unsqueeze(4) - cum.ref.unsqueeze(3); // [.., t, i, dk]: G_t - G_i
  Tensor later = torch::ones({chunk, chunk}, torch::kBool).triu(1).view({chunk, chunk, 1});
  Tensor ref = (x.ref.unsqueeze(4) * y.ref.unsqueeze(3) * exponent.masked_fill(later, -INFINITY).exp()).sum(-1);
  Tensor cot = torch::randn(ref.sizes(), f64).to(c.dtype).to(f64);
  ref.backward(cot);
  auto [dx, dy] = perChannelDecayedScoresBackward(cot.to(c.device, torch::kFloat32), x.ours.detach(), y.ours.detach(),
                                                  cum.ours);
  return {{"scores", ours, ref}, {"grad x", dx, x.ref.grad(), true}, {"grad y", dy, y.ref.grad(), true}};
}

/// Kimi's backward shape in float64 autograd: the scores of \p xa and of
/// \p xb against \p y under the decays of \p cum [.., c, dk] (leaves with
/// gradients), a random cotangent for each (the output's on and below the
/// diagonal, the system's strictly below, rounded to the tested dtype),
/// backpropagated into the leaves. Returns the cotangents.
std::pair<Tensor, Tensor> pairedScoresByAutograd(const Ctx &c, const Tensor &xa, const Tensor &xb, const Tensor &y,
                                                 const Tensor &cum) {
  const int64_t chunk = cum.size(-2);
  Tensor later = torch::ones({chunk, chunk}, torch::kBool).triu(1).view({chunk, chunk, 1});
  Tensor decay = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(later, -INFINITY).exp(); // [.., t, i, dk]
  Tensor scoresA = (xa.unsqueeze(4) * y.unsqueeze(3) * decay).sum(-1);
  Tensor scoresB = (xb.unsqueeze(4) * y.unsqueeze(3) * decay).sum(-1);
  Tensor cotA = torch::randn(scoresA.sizes(), f64).tril().to(c.dtype).to(f64);
  Tensor cotB = torch::randn(scoresB.sizes(), f64).tril(-1).to(c.dtype).to(f64);
  ((scoresA * cotA).sum() + (scoresB * cotB).sum()).backward();
  return {cotA, cotB};
}

/// pairedDecayedScoresBackward against autograd through two scores
/// products sharing y and G in float64: Kimi's backward shape (the output's
/// cotangent on and below the diagonal, the system's strictly below).
Trial kimiPairedScoresTrial(const Ctx &c, int64_t B, int64_t H, int64_t n, int64_t chunk, int64_t dk) {
  Input xa = input(c, torch::randn({B, H, n, chunk, dk}, f64), true, torch::kFloat32);
  Input xb = input(c, torch::randn({B, H, n, chunk, dk}, f64), true, torch::kFloat32);
  Input y = input(c, torch::randn({B, H, n, chunk, dk}, f64), true, torch::kFloat32);
  Input cum = input(c, torch::log_sigmoid(torch::randn({B, H, n, chunk, dk}, f64) + 2.0).cumsum(3), false,
                    torch::kFloat32);
  auto [cotA, cotB] = pairedScoresByAutograd(c, xa.ref, xb.ref, y.ref, cum.ref);
  PairedScoreGradients ours = pairedDecayedScoresBackward(cotA.to(c.device, torch::kFloat32), xa.ours.detach(),
                                                          cotB.to(c.device, torch::kFloat32), xb.ours.detach(),
                                                          y.ours.detach(), cum.ours);
  return {{"grad xA", ours.xA, xa.ref.grad(), true},
          {"grad xB", ours.xB, xb.ref.grad(), true},
          {"grad y", ours.y, y.ref.grad(), true}};
}

/// pairedDecayedScoresBackwardFromRows against autograd in float64: q and k
/// in the tested dtype (bf16 on a GPU: the kernel that forms q scale, k and
/// k b as it reads the rows, on tensor cores at c 64, dk 128 with
/// ADAPT_KIMI_SCORES_MMA=0 opts out), beta and G fp32, the cotangents as in
/// kimiPairedScoresTrial. The gradients are those of xA = q scale, xB = k b
/// and y = k, as Kimi's backward uses them.
Trial kimiPairedScoresRowsTrial(const Ctx &c, int64_t B, int64_t H, int64_t n, int64_t chunk, int64_t dk) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  Input q = input(c, torch::randn({B, H, n, chunk, dk}, f64), false);
  Input k = input(c, torch::randn({B, H, n, chunk, dk}, f64), false);
  Input beta = input(c, torch::rand({B, H, n, chunk, 1}, f64), false, torch::kFloat32);
  Input cum = input(c, torch::log_sigmoid(torch::randn({B, H, n, chunk, dk}, f64) + 2.0).cumsum(3), false,
                    torch::kFloat32);
  Tensor xa = (q.ref * scale).detach().requires_grad_(true), xb = (k.ref * beta.ref).detach().requires_grad_(true);
  Tensor y = k.ref.detach().requires_grad_(true);
  auto [cotA, cotB] = pairedScoresByAutograd(c, xa, xb, y, cum.ref);
  PairedScoreGradients ours =
      pairedDecayedScoresBackwardFromRows(cotA.to(c.device, torch::kFloat32), cotB.to(c.device, torch::kFloat32),
                                          q.ours, k.ours, beta.ours, cum.ours, scale);
  Trial trial{{"grad xA", ours.xA, xa.grad(), true}, {"grad xB", ours.xB, xb.grad(), true},
              {"grad y", ours.y, y.grad(), true}};
  // Every operand holds the tested dtype's values exactly, so the only error
  // is the arithmetic's: fp32 sums 9.4e-8 (CPU and the scalar kernel), TF32
  // tensor-core products 9.6e-5 (an H100, session 57). 1e-3 is 10x that, far
  // inside the bf16 bound, so a kernel that loses part of a tile fails here.
  constexpr double kArithmeticBound = 1e-3;
  std::string loose;
  for (const Item &item : trial) {
    const double error = measure(item.ours, item.ref).first;
    if (error > kArithmeticBound)
      loose += item.name + " " + std::to_string(error) + " > 1e-3; ";
  }
  trial.push_back(verdict("arithmetic error within 1e-3", loose));
  return trial;
}

} // namespace

void addLinearAttentionChecks(std::vector<Check> &all) {
  auto delta = [&](const std::string &id, DeltaCase d) {
    std::string shape = shapeText({{"B", 2}, {"H", d.H}, {"T", d.T}, {"dk", d.dk}, {"dv", d.dv}});
    if (!d.recurrent)
      shape += " C" + std::to_string(d.chunk);
    if (d.segment > 0)
      shape += " S" + std::to_string(d.segment);
    addCheck(all, id, shape, [=](const Ctx &c) { return deltaRuleTrial(c, d); });
  };
  // Gated delta rule (one decay per head): T a multiple of the chunk, not
  // one, shorter than one; dk != dv.
  delta("gated_delta_rule.recurrent", {3, 13, 8, 12, 0, false, true});
  delta("gated_delta_rule.chunked", {3, 16, 8, 8, 8});
  delta("gated_delta_rule.chunked", {3, 13, 8, 12, 5});
  delta("gated_delta_rule.chunked", {2, 5, 16, 10, 16});
  delta("gated_delta_rule.chunked", {3, 37, 10, 6, 8});
  delta("gated_delta_rule.chunked", {2, 67, 16, 16, 64});
  // The released widths (d 128, chunk 64), where the CUDA recurrence runs
  // several value tiles per head; dv 96 leaves a partial tile.
  delta("gated_delta_rule.chunked", {2, 130, 128, 128, 64});
  delta("gated_delta_rule.chunked", {1, 70, 128, 96, 64});
  // Whole chunks: the GPU backward reads dO's rows in place, not a padded copy.
  delta("gated_delta_rule.chunked", {1, 128, 128, 128, 64});
  // The forward without a graph at the released widths, where bf16 on a GPU
  // takes cuda::gatedDeltaRuleForward (unless ADAPT_DELTA_RULE_KERNEL=0): three
  // chunks, the last ragged; one whole chunk.
  delta("gated_delta_rule.no_grad", {2, 150, 128, 128, 64, false, false, 0, true});
  delta("gated_delta_rule.no_grad", {1, 64, 128, 128, 64, false, false, 0, true});
  // Segments recomputed in the backward pass: state and gradients carried
  // across segment boundaries (ragged last segment, segment not a multiple
  // of the chunk, per-channel decay).
  delta("gated_delta_rule.segmented", {3, 37, 10, 6, 4, false, false, 8});
  delta("gated_delta_rule.segmented", {2, 67, 16, 16, 8, false, false, 20});
  // The released widths in two segments (128 and a ragged 72 tokens): on a
  // GPU in bf16 the kernels' forward and backward, with the initial state's
  // and the final state's gradients.
  delta("gated_delta_rule.segmented", {2, 200, 128, 128, 64, false, false, 128});
  delta("kimi_delta.segmented", {3, 37, 10, 6, 4, true, false, 12});
  // Kimi delta attention (one decay per key channel).
  delta("kimi_delta.recurrent", {3, 13, 8, 12, 0, true, true});
  delta("kimi_delta.chunked", {3, 16, 8, 8, 8, true});
  delta("kimi_delta.chunked", {3, 13, 8, 12, 5, true});
  delta("kimi_delta.chunked", {2, 5, 16, 10, 16, true});
  delta("kimi_delta.chunked", {3, 37, 10, 6, 8, true});
  delta("kimi_delta.chunked", {2, 67, 16, 16, 64, true});
  delta("kimi_delta.chunked", {1, 70, 128, 96, 64, true});
  // The per-channel scores alone: one block (c <= 16, the pairwise form),
  // sub-chunks, and Kimi's chunk at d 128 (the kernels' shapes on a GPU).
  auto scores = [&](int64_t B, int64_t H, int64_t n, int64_t chunk, int64_t dk) {
    std::string shape = shapeText({{"B", B}, {"H", H}, {"n", n}, {"c", chunk}, {"dk", dk}});
    addCheck(all, "kimi_scores.pairs", shape, [=](const Ctx &c) { return kimiScoresTrial(c, B, H, n, chunk, dk); });
    addCheck(all, "kimi_scores.paired_backward", shape,
             [=](const Ctx &c) { return kimiPairedScoresTrial(c, B, H, n, chunk, dk); });
  };
  // Kimi's backward reads q and k as the input's rows: a ragged chunk (the
  // scalar kernel on a GPU) and Kimi-Linear's 64 x 128 (the tensor-core one
  // unless ADAPT_KIMI_SCORES_MMA=0), three chunks each.
  for (auto [chunk, dk] : {std::pair<int64_t, int64_t>{40, 100}, {64, 128}}) {
    std::string shape = shapeText({{"B", 1}, {"H", 2}, {"n", 3}, {"c", chunk}, {"dk", dk}});
    addCheck(all, "kimi_scores.paired_backward_rows", shape,
             [=](const Ctx &c) { return kimiPairedScoresRowsTrial(c, 1, 2, 3, chunk, dk); });
  }
  scores(2, 2, 3, 16, 8);
  scores(1, 2, 2, 48, 32);
  scores(1, 2, 2, 64, 128);
  // A ragged last block of 8 rows and channels no multiple of 8 (the
  // sub-chunk kernels' guards, the default on a GPU).
  scores(1, 2, 2, 40, 100);
  // A chunk no multiple of 4: the row-block backward's scalar path and its
  // last group of one row.
  scores(1, 2, 2, 37, 64);
  // Training's forward kernels at the released widths on a GPU in bf16 (three
  // chunks, the last ragged), and whole chunks: there the backward's bf16
  // operands (ADAPT_KIMI_BF16_OPERANDS) are dO's rows in place and dq, dk
  // the tail kernel's own.
  delta("kimi_delta.chunked", {2, 130, 128, 128, 64, true});
  delta("kimi_delta.chunked", {1, 128, 128, 128, 64, true});
  // The forward without a graph at the released widths: on a GPU in bf16
  // cuda::kimiDeltaRuleForward (three chunks,
  // the last ragged; one whole chunk).
  delta("kimi_delta.no_grad", {2, 150, 128, 128, 64, true, false, 0, true});
  delta("kimi_delta.no_grad", {1, 64, 128, 128, 64, true, false, 0, true});
  // Chunks of 32 and 48: two and three sub-chunks of 16 (the factored
  // cross-sub-chunk products), the last chunk ragged.
  delta("kimi_delta.chunked", {2, 100, 12, 8, 32, true});
  delta("kimi_delta.chunked", {2, 101, 8, 6, 48, true});

  // The last two: several 64-step runs of the CUDA kernel (ADAPT_CONV_KERNEL=1),
  // the last one ragged, and K 3.
  for (auto [T, C, K] :
       std::vector<std::array<int64_t, 3>>{{13, 10, 4}, {3, 7, 4}, {17, 5, 2}, {200, 72, 4}, {130, 7, 3}})
    addCheck(all, "causal_conv1d.silu", shapeText({{"B", 2}, {"T", T}, {"C", C}, {"K", K}}),
             [=](const Ctx &c) { return convTrial(c, T, C, K); });
  // {70, 128}: the linear-attention heads' width, as the gated-norm kernels
  // (ADAPT_GATED_NORM_KERNEL=1) see it; 33 stays on the composition.
  for (auto [N, D] : std::vector<std::array<int64_t, 2>>{{13, 16}, {7, 33}, {5, 264}, {70, 128}}) {
    std::string shape = shapeText({{"N", N}, {"D", D}});
    addCheck(all, "norm.gated_rms", shape, [=](const Ctx &c) { return gatedNormTrial(c, N, D); });
    addCheck(all, "norm.gated_rms_sigmoid", shape, [=](const Ctx &c) { return sigmoidGatedNormTrial(c, N, D); });
    addCheck(all, "norm.zero_centred_rms", shape, [=](const Ctx &c) { return zeroCentredTrial(c, N, D); });
    addCheck(all, "norm.l2", shape, [=](const Ctx &c) { return l2Trial(c, N, D); });
  }
  for (auto [T, H, D] : std::vector<std::array<int64_t, 3>>{{9, 3, 128}, {5, 2, 16}})
    addCheck(all, "norm.l2.strided", shapeText({{"B", 2}, {"T", T}, {"H", H}, {"D", D}}),
             [=](const Ctx &c) { return l2StridedTrial(c, 2, T, H, D); });
}

} // namespace adapt::rt::opcheck
