//===- KimiDeltaFunction.cpp - the per-channel delta rule, backward written out ---===//
//
// Shapes inside: [b, h, n, c, d] for n chunks of c tokens, fp32; G, the
// chunk's cumulative log decay, is [b, h, n, c, dk]. Padding tokens (k = 0,
// b = 0, decay 0) change nothing, and their gradients are dropped.
//
//===----------------------------------------------------------------------===//

#include "runtime/KimiDeltaFunction.h"
#include "runtime/ChunkedTensors.h"
#include "runtime/KernelLedger.h"
#include "runtime/Tf32Scope.h"
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/DeltaRuleKernel.h"
#include "runtime/cuda/KimiBackwardTailKernel.h"
#include "runtime/cuda/KimiChunkGradKernel.h"
#include "runtime/cuda/KimiDeltaKernel.h"
#include "runtime/cuda/KimiTermsKernel.h"
#include "runtime/cuda/PerChannelScoresKernel.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace adapt::rt {

namespace {

using torch::Tensor;

/// exp(cum_t - cum_i) for positions i <= t along dimension -2 of \p cum
/// [..., size, G] (G: one decay, or one per key channel), zero for i > t:
/// [..., t, i, G].
torch::Tensor decayBetween(const torch::Tensor &cum) {
  const int64_t size = cum.size(-2);
  torch::Tensor upper =
      torch::ones({size, size}, torch::TensorOptions().dtype(torch::kBool).device(cum.device())).triu(1);
  return (cum.unsqueeze(-2) - cum.unsqueeze(-3)).masked_fill(upper.unsqueeze(-1), -INFINITY).exp();
}

/// Sub-chunk length of the per-channel decay's pairwise products.
constexpr int64_t kSubChunk = 16;

/// The sub-chunk view of x [b, h, n, c, d]: [b, h, n, m, s, d].
Tensor subChunks(const Tensor &x) {
  std::vector<int64_t> blocks(x.sizes().begin(), x.sizes().begin() + 3);
  blocks.insert(blocks.end(), {x.size(3) / kSubChunk, kSubChunk, x.size(4)});
  return x.reshape(blocks);
}

/// True where key sub-chunk j is not before query sub-chunk p: [m(p), m(j), 1, 1].
Tensor notEarlier(int64_t m, const torch::Device &device) {
  return torch::ones({m, m}, torch::TensorOptions().dtype(torch::kBool).device(device))
      .tril(-1)
      .logical_not()
      .view({m, m, 1, 1});
}

} // namespace

/// sum_d x_td y_id exp(cum_td - cum_id) for i <= t within each chunk (zero
/// above the diagonal), for a decay per key channel d (Kimi delta
/// attention): x, y, cum [b, h, n, c, dk] -> [b, h, n, c, c].
///
/// Materialising exp(cum_t - cum_i) for every pair and channel costs
/// c^2 dk values per chunk (64 x 64 x 128 fp32: 2 MiB per chunk and head,
/// several times over in the backward pass). Instead the chunk is split in
/// sub-chunks of kSubChunk positions: pairs within a sub-chunk keep the
/// pairwise form (c kSubChunk dk values), and a pair whose key sits in an
/// earlier sub-chunk j factors through j's last position r_j as
/// (x_t exp(cum_t - r_j)) . (y_i exp(r_j - cum_i)), one GEMM per pair of
/// sub-chunks. Both exponents are <= 0 (log decays are <= 0 and t > r_j >=
/// i), so neither factor overflows, and one underflows only where the exact
/// product is smaller still.
torch::Tensor perChannelDecayedScores(const torch::Tensor &x, const torch::Tensor &y, const torch::Tensor &cum) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("kimi_scores.forward", x, cuda::perChannelScoresKernelEnabled(),
                   cuda::perChannelScoresTakes(x, y, cum)))
    return cuda::perChannelScores(x, y, cum);
#endif
  const int64_t c = x.size(3), dk = x.size(4);
  if (c <= kSubChunk || c % kSubChunk != 0) // one block: the pairwise form
    return (x.unsqueeze(4) * y.unsqueeze(3) * decayBetween(cum)).sum(-1);
  const int64_t m = c / kSubChunk, s = kSubChunk;
  std::vector<int64_t> blocks(x.sizes().begin(), x.sizes().begin() + 3);
  blocks.insert(blocks.end(), {m, s, dk});
  const torch::Tensor xs = x.reshape(blocks), ys = y.reshape(blocks), cs = cum.reshape(blocks); // [b, h, n, m, s, dk]
  // Within each sub-chunk: [b, h, n, m, t, i].
  torch::Tensor within = (xs.unsqueeze(5) * ys.unsqueeze(4) * decayBetween(cs)).sum(-1);
  // Across: r_j = cum at sub-chunk j's last position; the query side for
  // every (p, j) with j < p (other pairs masked to exp(-inf) = 0).
  torch::Tensor ref = cs.select(4, s - 1);                                  // [b, h, n, m(j), dk]
  torch::Tensor keys = ys * (ref.unsqueeze(4) - cs).exp();                  // [b, h, n, m(j), s(i), dk]
  torch::Tensor earlier = torch::ones({m, m}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
                              .tril(-1)
                              .logical_not()
                              .view({m, m, 1, 1});                          // true where j >= p
  torch::Tensor exponent = (cs.unsqueeze(4) - ref.unsqueeze(3).unsqueeze(5)) // [b, h, n, m(p), m(j), s(t), dk]
                               .masked_fill(earlier, -INFINITY);
  torch::Tensor queries = xs.unsqueeze(4) * exponent.exp();
  torch::Tensor across = torch::matmul(queries, keys.unsqueeze(3).transpose(-1, -2)); // [b, h, n, p, j, t, i]
  // The sub-chunks' own blocks on the diagonal (p == j), then [c, c].
  torch::Tensor diagonal = torch::eye(m, x.options()).view({m, m, 1, 1});
  torch::Tensor all = across + within.unsqueeze(4) * diagonal;
  std::vector<int64_t> square(x.sizes().begin(), x.sizes().begin() + 3);
  square.insert(square.end(), {c, c});
  return all.permute({0, 1, 2, 3, 5, 4, 6}).reshape(square);
}

std::pair<Tensor, Tensor> perChannelDecayedScoresBackward(const Tensor &grad, const Tensor &x, const Tensor &y,
                                                          const Tensor &cum) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("kimi_scores.backward", x, cuda::perChannelScoresKernelEnabled(),
                   cuda::perChannelScoresTakes(x, y, cum)))
    return cuda::perChannelScoresBackward(grad, x, y, cum);
#endif
  const int64_t c = x.size(3);
  if (c <= kSubChunk || c % kSubChunk != 0) { // one block: the pairwise form
    Tensor weighted = grad.unsqueeze(-1) * decayBetween(cum); // [.., t, i, dk]
    return {(weighted * y.unsqueeze(3)).sum(4), (weighted * x.unsqueeze(4)).sum(3)};
  }
  const int64_t m = c / kSubChunk, s = kSubChunk;
  const Tensor xs = subChunks(x), ys = subChunks(y), cs = subChunks(cum); // [b, h, n, m, s, dk]
  // The cotangent's blocks [b, h, n, m(p), m(j), s(t), s(i)].
  std::vector<int64_t> blocks(grad.sizes().begin(), grad.sizes().begin() + 3);
  blocks.insert(blocks.end(), {m, s, m, s});
  const Tensor gs = grad.reshape(blocks).permute({0, 1, 2, 3, 5, 4, 6});
  // Within each sub-chunk (p == j).
  Tensor within = torch::diagonal(gs, 0, 3, 4).permute({0, 1, 2, 5, 3, 4}).unsqueeze(-1) * decayBetween(cs);
  Tensor dx = (within * ys.unsqueeze(4)).sum(5), dy = (within * xs.unsqueeze(5)).sum(4); // [b, h, n, m, s, dk]
  // Across (j < p), through r_j = cum at sub-chunk j's last position.
  Tensor ref = cs.select(4, s - 1);                                   // [b, h, n, m(j), dk]
  Tensor keyScale = (ref.unsqueeze(4) - cs).exp();                    // [b, h, n, m(j), s(i), dk]
  Tensor queryScale = (cs.unsqueeze(4) - ref.unsqueeze(3).unsqueeze(5)) // [b, h, n, m(p), m(j), s(t), dk]
                          .masked_fill(notEarlier(m, x.device()), -INFINITY)
                          .exp();
  dx = dx + (torch::matmul(gs, (ys * keyScale).unsqueeze(3)) * queryScale).sum(4);
  dy = dy + torch::matmul(transposed(gs), xs.unsqueeze(4) * queryScale).sum(3) * keyScale;
  return {dx.reshape(x.sizes()), dy.reshape(y.sizes())};
}

PairedScoreGradients pairedDecayedScoresBackward(const Tensor &gradA, const Tensor &xA, const Tensor &gradB,
                                                 const Tensor &xB, const Tensor &y, const Tensor &cum) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("kimi_scores.paired_backward", y, cuda::pairedScoresBackwardEnabled(),
                   cuda::perChannelScoresTakes(xA, y, cum) && cuda::perChannelScoresTakes(xB, y, cum))) {
    auto [dxA, dxB, dy] = cuda::perChannelScoresPairedBackward(gradA, xA, gradB, xB, y, cum);
    return {dxA, dxB, dy};
  }
#endif
  auto [dxA, dyA] = perChannelDecayedScoresBackward(gradA, xA, y, cum);
  auto [dxB, dyB] = perChannelDecayedScoresBackward(gradB, xB, y, cum);
  return {dxA, dxB, dyA.add_(dyB)};
}

PairedScoreGradients pairedDecayedScoresBackwardFromRows(const Tensor &gradA, const Tensor &gradB, const Tensor &query,
                                                         const Tensor &key, const Tensor &beta, const Tensor &cum,
                                                         double scale) {
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("kimi_scores.paired_backward", key, cuda::pairedScoresBackwardEnabled(),
                   cuda::pairedScoresBf16KeysTake(query, key, beta, cum))) {
    auto [dxA, dxB, dy] = cuda::perChannelScoresPairedBackwardBf16Keys(gradA, gradB, query, key, beta, cum, scale);
    return {dxA, dxB, dy};
  }
#endif
  const Tensor k = key.to(torch::kFloat32);
  return pairedDecayedScoresBackward(gradA, query.to(torch::kFloat32) * scale, gradB, k * beta, k, cum);
}

// The budget's measurements (KimiDeltaFunction.h): slices cost time, the
// state backward kernel's grid being B·h x 4 blocks. At 1 x 32 heads x 32K
// on an H100 (session 46), forward + backward and peak: one pass 49.4 ms,
// 21.8 GiB; slices of 16 heads 52.6 ms, 14.2 GiB; of 8 (the earlier 128 MiB
// budget) 56.9 ms, 9.7 GiB. Session 56 (H100), with the backward holding
// less (bf16 rows): one pass 25.4-25.5 ms, 8.93 GiB (fla's KDA: 9.78);
// slices of 16 28.2-28.3 ms, 7.80 GiB; at 128K slices of 8 123.2 ms, 26.3
// GiB, of 4 152.1 ms, 23.9 GiB. So the budget is now 512 MiB.
int64_t kimiBackwardSliceHeads(int64_t batch, int64_t paddedTokens, int64_t keyDim) {
  if (const char *v = std::getenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS")) {
    char *end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    TORCH_CHECK(end != v && *end == '\0' && n > 0, "ADAPT_KIMI_BACKWARD_SLICE_HEADS: expected a positive count, found '",
                v, "'");
    return n;
  }
  constexpr int64_t kSliceBytes = int64_t(512) << 20;
  const int64_t perHead = std::max<int64_t>(1, batch * paddedTokens * keyDim * int64_t(sizeof(float)));
  return std::max<int64_t>(1, kSliceBytes / perHead);
}

namespace {

/// What forward and backward both derive from the inputs.
struct KimiTerms {
  Tensor gamma;     ///< e^G (undefined after the GPU kernel: decays() gives it).
  Tensor last;      ///< G of the chunk's last token [b, h, n, 1, dk].
  Tensor toEnd;     ///< e^{G_last - G} (undefined after the GPU kernel: decays() gives it).
  Tensor keysWeighted; ///< Xk = b k e^G.
  Tensor keysToEnd;    ///< Kd = k e^{G_last - G}.
  Tensor keysBeta;     ///< k b.
  Tensor queryDecayed; ///< Qd = q e^G (when a query was given: the backward's).
  /// The terms of \p k, \p beta and \p cum, and q e^G when \p q is defined:
  /// on a GPU in one kernel pass when q is given (unless ADAPT_KIMI_FUSED_TERMS=0)
  /// (cuda::kimiFusedTerms, the same products in the same order), else
  /// LibTorch's passes.
  /// With \p bf16Decayed the kernel writes Kd and Qd in bf16 (their one
  /// reader is then the state pass, which takes bf16 operands).
  /// \p q and \p k may be the bf16 inputs (bf16Rows, which requires the
  /// kernel): q times \p queryScale, and keysBeta left undefined.
  KimiTerms(const Tensor &q, const Tensor &k, const Tensor &beta, const Tensor &cum, bool bf16Decayed = false,
            double queryScale = 1.0) {
    last = cum.narrow(3, cum.size(3) - 1, 1);
#ifdef ADAPT_WITH_CUDA_KERNELS
    if (q.defined() && chooseKernel("kimi_delta_rule.backward_terms", k, cuda::kimiFusedTermsEnabled(),
                                    cuda::kimiFusedTermsTake(q, k, beta, cum))) {
      cuda::KimiTermTensors t = cuda::kimiFusedTerms(q, k, beta, cum, bf16Decayed, queryScale);
      keysBeta = t.keysBeta, keysWeighted = t.keysWeighted, keysToEnd = t.keysToEnd, queryDecayed = t.queryDecayed;
      return;
    }
#endif
    TORCH_CHECK(k.scalar_type() == torch::kFloat32 && queryScale == 1.0,
                "KimiTerms: fp32 chunks expected without the terms kernel, found ", k.scalar_type());
    gamma = cum.exp();
    toEnd = (last - cum).exp();
    keysBeta = k * beta;
    keysWeighted = keysBeta * gamma;
    keysToEnd = k * toEnd;
    if (q.defined())
      queryDecayed = q * gamma;
  }
  /// {e^G, e^{G_last - G}} of \p cum: the ones held, else computed (after the
  /// GPU kernel, which leaves them to the one reader that needs them).
  std::pair<Tensor, Tensor> decays(const Tensor &cum) const {
    return {gamma.defined() ? gamma : cum.exp(), toEnd.defined() ? toEnd : (last - cum).exp()};
  }
  /// diag(e^{G_last}) - Kd^T W, the chunk's state transition [b, h, n, dk, dk].
  Tensor transition(const Tensor &w) const {
    return torch::diag_embed(last.exp().squeeze(3)) - torch::matmul(transposed(keysToEnd), w);
  }
};

struct KimiDeltaNode : torch::autograd::Function<KimiDeltaNode> {
  /// Outputs {O [B, H, T, dv] in the query's dtype, S_T fp32}; \p state
  /// [B, H, dk, dv] (zeros when no initial state was given).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const Tensor &query,
                                                const Tensor &key, const Tensor &value, const Tensor &decay,
                                                const Tensor &beta, const Tensor &state, int64_t chunk, bool tf32) {
    const Tf32Scope scope(tf32);
    const int64_t b = key.size(0), h = key.size(1), t = key.size(2), dk = key.size(3), dv = value.size(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    saveDeltaRuleShape(ctx, t, {query, key, value, decay, beta, state}, tf32, chunk);
#ifdef ADAPT_WITH_CUDA_KERNELS
    // bf16 at d 128 on the GPU, when switched on: the forward kernels, which
    // hand over T, the states and V_new (bf16) for the backward below.
    if (t > 0 && chooseKernel("kimi_delta_rule.train", key, cuda::kimiDeltaTrainingKernelEnabled(),
                              cuda::kimiDeltaRuleForwardTakes(query, key, value, decay, beta, chunk))) {
      cuda::KimiDeltaSaved kept;
      Tensor last;
      Tensor out = cuda::kimiDeltaRuleForward(query, key, value, decay, beta, state, &last, &kept);
      const int64_t n = kept.states.size(1);
      ctx->saved_data["kernels"] = true;
      ctx->save_for_backward({query, key, value, decay, beta, kept.inverse.view({b, h, n, chunk, chunk}),
                              kept.states.view({b, h, n, dk, dv}), kept.newValues.view({b, h, n, chunk, dv}),
                              kept.scores.defined() ? kept.scores.view({b, h, n, chunk, chunk}) : Tensor()});
      return {out, last.view({b, h, dk, dv})};
    }
#endif
    Tensor q = toChunks(query, chunk) * scale, k = toChunks(key, chunk), v = toChunks(value, chunk);
    Tensor bt = toChunks(beta.unsqueeze(-1), chunk), cum = toChunks(decay, chunk).cumsum(3);
    const KimiTerms terms(Tensor(), k, bt, cum);
    Tensor system = perChannelDecayedScores(terms.keysBeta, k, cum); // its diagonal is ignored: unit triangular
    Tensor inverse = torch::linalg_solve_triangular(system, torch::eye(chunk, system.options()), /*upper=*/false,
                                                    /*left=*/true, /*unitriangular=*/true);
    Tensor w = torch::matmul(inverse, terms.keysWeighted), u = torch::matmul(inverse, v * bt);
    auto [states, s] = chunkStates(terms.transition(w), torch::matmul(transposed(terms.keysToEnd), u),
                                   state.to(torch::kFloat32).reshape({b * h, dk, dv}));
    Tensor newValues = u - torch::matmul(w, states);
    Tensor out = torch::matmul(q * terms.gamma, states) + torch::matmul(perChannelDecayedScores(q, k, cum), newValues);
    // The inputs themselves (bf16 in training), not their fp32 chunks: the
    // backward rebuilds those.
    ctx->save_for_backward({query, key, value, decay, beta, inverse, states, newValues});
    return {fromChunks(out, t, query.scalar_type()), s.view({b, h, dk, dv})};
  }

  /// The backward over slices of the heads (kimiBackwardSliceHeads), each
  /// slice's fp32 intermediates freed before the next: at 1 x 32 heads x 32K
  /// tokens one [B, H, T, 128] fp32 tensor is 512 MiB and the backward holds
  /// dozens of them. The gradients are written into whole tensors.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<Tensor> saved = ctx->get_saved_variables();
    const int64_t heads = saved[1].size(1), c = ctx->saved_data["chunk"].toInt();
    const int64_t paddedTokens = (saved[1].size(2) + c - 1) / c * c;
    const int64_t step = kimiBackwardSliceHeads(saved[1].size(0), paddedTokens, saved[1].size(3));
    if (step >= heads)
      return backwardHeads(ctx, saved, grads);
    torch::autograd::variable_list whole;
    for (int64_t h0 = 0; h0 < heads; h0 += step) {
      const int64_t count = std::min(step, heads - h0);
      auto slice = [&](const Tensor &x) { return x.defined() ? x.narrow(1, h0, count) : x; };
      std::vector<Tensor> savedSlice;
      for (const Tensor &x : saved)
        savedSlice.push_back(slice(x));
      const torch::autograd::variable_list part = backwardHeads(ctx, savedSlice, {slice(grads[0]), slice(grads[1])});
      if (whole.empty())
        for (const Tensor &g : part) {
          if (!g.defined()) {
            whole.emplace_back();
            continue;
          }
          std::vector<int64_t> sizes = g.sizes().vec();
          sizes[1] = heads;
          whole.push_back(torch::empty(sizes, g.options()));
        }
      for (size_t i = 0; i < part.size(); ++i)
        if (part[i].defined())
          whole[i].narrow(1, h0, count).copy_(part[i]);
    }
    return whole;
  }

  /// The backward of heads [B, h, ..] of the node: \p saved and \p grads
  /// narrowed to them.
  static torch::autograd::variable_list backwardHeads(torch::autograd::AutogradContext *ctx,
                                                      const std::vector<Tensor> &saved,
                                                      const torch::autograd::variable_list &grads) {
    const Tf32Scope scope(ctx->saved_data["tf32"].toBool());
    // fp32 from the composition, bf16 states and V_new from the kernels
    // (converted to fp32 only where the composition below needs them).
    const Tensor &inverse = saved[5], &savedStates = saved[6], &savedNewValues = saved[7];
    const int64_t t = ctx->saved_data["t"].toInt(), c = ctx->saved_data["chunk"].toInt();
    const std::vector<int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    const double scale = 1.0 / std::sqrt(static_cast<double>(saved[1].size(3)));
    // k as stored (bf16 chunks in training, a view when T is whole chunks):
    // the kernels' choices below look at it; its fp32 copy is made below unless bf16Rows.
    const Tensor keyRows = toChunks(saved[1], c, saved[1].scalar_type());
    // v as stored when bf16/fp16: its two products (with b's fp32 chunks and
    // dXv) promote to fp32 exactly as its fp32 copy would, and the copy's
    // [.., c, dv] fp32 tensor is not held through the chunk gradients. Not
    // const: freed once v's two terms are taken (below).
    Tensor v = reducedFloat(saved[2]) ? toChunks(saved[2], c, saved[2].scalar_type()) : toChunks(saved[2], c);
    const Tensor cum = toChunks(saved[3], c).cumsum(3), bt = toChunks(saved[4].unsqueeze(-1), c);
    const int64_t b = keyRows.size(0), h = keyRows.size(1), dk = keyRows.size(4), dv = v.size(4);
    const torch::TensorOptions f32 = cum.options();
    const Masks m(c, cum.device());
    const bool scoresSaved = saved.size() > 8 && saved[8].defined();
    // Which tail runs (below): the kernel derives its own terms, so with it
    // the chunk terms' last reader comes earlier.
#ifdef ADAPT_WITH_CUDA_KERNELS
    const bool tailKernel = chooseKernel("kimi_delta_rule.backward_tail", keyRows, cuda::kimiBackwardTailEnabled(),
                                         cuda::kimiBackwardTailTakes(keyRows));
    // After the forward kernels: the serial pass as one kernel (GDN's, its
    // state rows decaying per key channel), then (unless switched off) the
    // chunk gradients as one kernel reading its bf16 results as they are.
    const bool stateKernel = ctx->saved_data.count("kernels") > 0 && cuda::deltaRuleStateBackwardTakes(dk, dv, c);
    // bf16 operands where the kernels read them in bf16 anyway: dO as it
    // arrives (its fp32 copy and the cast back for the state pass spared),
    // P^T dO from bf16 P and dO with fp32 accumulation and output, and Kd
    // and Qd from the terms kernel in bf16 when the tail kernel leaves the
    // state pass their only reader, dq and dk (and with the value terms dv)
    // written in bf16 by the kernels. The forward kernels ("kernels") take
    // bf16 q, k and v only, so those are the gradients' dtypes here too.
    const bool bf16Operands = stateKernel && scoresSaved && cuda::kimiBf16OperandsEnabled() &&
                              grads[0].defined() && grads[0].scalar_type() == torch::kBFloat16;
#else
    const bool tailKernel = false, bf16Operands = false;
#endif
    Tensor dOut = grads[0].defined() ? toChunks(grads[0], c, bf16Operands ? torch::kBFloat16 : torch::kFloat32)
                                     : torch::zeros(savedNewValues.sizes(), f32);
#ifdef ADAPT_WITH_CUDA_KERNELS
    const bool chunkKernel = stateKernel && chooseKernel("kimi_delta_rule.chunk_gradients", keyRows,
                                                         cuda::kimiChunkGradientsEnabled(),
                                                         cuda::kimiChunkGradientsTake(dOut, savedStates));
    // With bf16 v, the chunk-gradient kernel takes dXv's two uses itself.
    const bool valueTerms = chunkKernel && bf16Operands && cuda::kimiValueTermsEnabled();
    // With every kernel after it, q, k and v's readers can take the bf16
    // inputs as they are (kimiBf16RowsEnabled): q scale, k, k b and v b are
    // formed as they are read, never written in fp32.
    const bool rowsWanted = valueTerms && tailKernel && cuda::kimiBf16RowsEnabled() &&
                            cuda::kimiFusedTermsEnabled() && cuda::perChannelScoresKernelEnabled() &&
                            cuda::pairedScoresBackwardEnabled();
    const Tensor queryRows = rowsWanted ? toChunks(saved[0], c, saved[0].scalar_type()) : Tensor();
    const bool bf16Rows = rowsWanted && cuda::kimiFusedTermsTake(queryRows, keyRows, bt, cum) &&
                          cuda::pairedScoresBf16KeysTake(queryRows, keyRows, bt, cum);
#else
    const bool chunkKernel = false, valueTerms = false, bf16Rows = false;
    const Tensor queryRows;
#endif
    // q and k: with bf16Rows the bf16 inputs themselves (q unscaled: the kernels apply the
    // scale as they read), else fp32 chunks, q times the scale.
    const Tensor q = bf16Rows ? queryRows : scaledChunks(saved[0], c, scale);
    const Tensor k = bf16Rows ? keyRows : toChunks(saved[1], c);
    // not const: freed after the last reader
    KimiTerms terms(q, k, bt, cum, bf16Operands && chunkKernel && tailKernel, bf16Rows ? scale : 1.0);
    Tensor xv = bf16Rows ? Tensor() : v * bt; // with bf16Rows the chunk-gradient kernel forms Xv = b v
    const Tensor &queryDecayed = terms.queryDecayed;
    Tensor w = torch::matmul(inverse, terms.keysWeighted);
    Tensor dLast = grads[1].defined() ? grads[1].to(torch::kFloat32).reshape({b * h, dk, dv})
                                      : torch::zeros({b * h, dk, dv}, f32);

    // The state's gradient from the last chunk back: dS = M^T dS' + Qd^T dO - W^T P^T dO,
    // P the forward kernel's scores where it saved them (kimiSavedScoresEnabled), else rebuilt.
    Tensor localNew;
    if (bf16Operands) { // bf16 P^T and dO, fp32 products and sums: [b·h·n, c, dv]
      const Tensor scores = saved[8].reshape({-1, c, c}), gradOut = dOut.reshape({-1, c, dv});
      localNew = at::bmm(transposed(scores), gradOut, torch::kFloat32).view(dOut.sizes());
    } else {
      localNew = torch::matmul(
          transposed(scoresSaved ? saved[8].to(torch::kFloat32) : perChannelDecayedScores(q, k, cum)), dOut); // P^T dO
    }
    // The chunk gradients through O = Qd S + P V_new, S' = diag(e^{G_last})
    // S + Kd^T V_new, V_new = U - W S, W = T Xk, U = T Xv and T = (I + A)^-1
    // with A = strictly-lower(diag(b) P_kk); leavingDotState = sum_v dS' . S.
    Tensor ds, dQueryDecayed, dScores, dKeysToEnd, dXk, dXv, dSystem, leavingDotState;
    Tensor kernelValueGrad, kernelBetaValues; // dXv's two uses, when the chunk-gradient kernel took them
#ifdef ADAPT_WITH_CUDA_KERNELS
    if (chunkKernel) {
      cuda::DeltaRuleStateGrads state = stateGradientsOnGpuRaw(terms.keysToEnd, w, queryDecayed, dOut, localNew,
                                                               terms.last, dLast, /*perChannel=*/true);
      w.reset(), localNew.reset(); // read by the state pass only: freed before the chunk gradients' outputs
      if (tailKernel) // the tail kernel derives its own: the state pass was their last reader
        terms.keysToEnd.reset(), terms.queryDecayed.reset();
      const cuda::KimiChunkGrads chunk =
          cuda::kimiChunkGradients(dOut, savedStates, savedNewValues, state.leaving, state.newValues,
                                   terms.keysWeighted, xv, inverse, valueTerms ? v : Tensor(), valueTerms ? bt : Tensor());
      ds = state.initial;
      dQueryDecayed = chunk.queryDecayed, dScores = chunk.scores, dKeysToEnd = chunk.keysToEnd;
      dXk = chunk.keysWeighted, dXv = chunk.valuesWeighted, dSystem = chunk.system;
      leavingDotState = chunk.leavingDotState;
      kernelValueGrad = chunk.values, kernelBetaValues = chunk.betaValues;
    }
#endif
    if (!dQueryDecayed.defined()) {
      const Tensor states = savedStates.to(torch::kFloat32), newValues = savedNewValues.to(torch::kFloat32);
      dOut = dOut.to(torch::kFloat32); // bf16 when the chunk-gradient kernel was switched off or refused
      Tensor dLeaving, dNew;
#ifdef ADAPT_WITH_CUDA_KERNELS
      if (stateKernel)
        std::tie(dLeaving, dNew, ds) = stateGradientsOnGpu(terms.keysToEnd, w, queryDecayed, dOut, localNew,
                                                           terms.last, dLast, /*perChannel=*/true);
#endif
      if (!dLeaving.defined())
        std::tie(dLeaving, dNew, ds) =
            stateGradients(terms.transition(w), terms.keysToEnd, w, queryDecayed, dOut, localNew, dLast);
      dQueryDecayed = torch::matmul(dOut, transposed(states));
      dScores = torch::matmul(dOut, transposed(newValues)) * m.inclusive;
      dKeysToEnd = torch::matmul(newValues, transposed(dLeaving));
      Tensor dW = -torch::matmul(dNew, transposed(states));
      Tensor dInverse = torch::matmul(dW, transposed(terms.keysWeighted)) + torch::matmul(dNew, transposed(xv));
      dXk = torch::matmul(transposed(inverse), dW), dXv = torch::matmul(transposed(inverse), dNew);
      dSystem = -torch::matmul(torch::matmul(transposed(inverse), dInverse), transposed(inverse)) * m.strict;
      leavingDotState = (dLeaving * states).sum(-1).unsqueeze(3);
    }
    // The backward's peak comes in the score gradients and the tail below:
    // free the [.., 64, 128] fp32 chunk tensors nothing after this reads
    // (128 MiB each at 1 x 32 heads x 8K).
    w.reset(), dOut.reset(), localNew.reset(), xv.reset();
    // v's gradient (already in v's dtype: the one rounding it gets anyway)
    // and its term in b's, taken now so that v and dXv (fp32 chunk tensors)
    // are freed before the peak, not held through it.
    Tensor dValue = kernelValueGrad, dBetaValues = kernelBetaValues;
    if (!dValue.defined()) {
      dValue = torch::empty(dXv.sizes(), dXv.options().dtype(static_cast<torch::ScalarType>(dtypes[2])));
      torch::mul_out(dValue, dXv, bt); // one pass on a GPU: the product in fp32, rounded as it is stored
      dBetaValues = (dXv * v).sum(-1, true);
    }
    dXv.reset(), v.reset();
    if (tailKernel)
      terms.keysWeighted.reset(), terms.keysToEnd.reset(), terms.queryDecayed.reset();
    // The output's scores are q's against k, the system's x = b k's against
    // k: the latter's x gradient gives k's row term (times b) and b's term
    // (its dot with k), so the key pairs P_kk themselves (a scores pass) are
    // never rebuilt. Only the sum of the two key-column gradients is needed.
    // With bf16Rows, q and k are the bf16 rows (q unscaled) and the kernel
    // forms q scale, k and k b as it reads them (the entry point the
    // `kimi_scores.paired_backward_rows` op check calls).
    PairedScoreGradients scoreGrads = // not const: freed after its last reader
        bf16Rows ? pairedDecayedScoresBackwardFromRows(dScores, dSystem, q, k, bt, cum, scale)
                 : pairedDecayedScoresBackward(dScores, q, dSystem, terms.keysBeta, k, cum);
    const Tensor &dqScores = scoreGrads.xA, &dKeysBeta = scoreGrads.xB, &dkColumns = scoreGrads.y;
    dScores.reset(), dSystem.reset(), terms.keysBeta.reset();

    // The sums of products into dq, dk, dG and beta's key terms: one kernel
    // on the GPU when switched on (runtime/cuda/KimiBackwardTailKernel.h,
    // which states them as formulas), else the composition below.
    Tensor dq, dKey, dCum, dBetaKeys, keysToEndSums, dDecay;
#ifdef ADAPT_WITH_CUDA_KERNELS
    if (tailKernel) {
      // Unless ADAPT_KIMI_TAIL_DECAY_GRADIENT=0 it also finishes the log
      // decays' gradient (decayGradient below, with dLastCum's terms).
      cuda::KimiBackwardTail tail =
          cuda::kimiBackwardTail(q, k, cum, bt, dqScores, dQueryDecayed, dKeysBeta, dkColumns, dXk, dKeysToEnd, scale,
                                 cuda::kimiTailDecayGradientEnabled() ? leavingDotState : Tensor(),
                                 bf16Operands ? torch::kBFloat16 : torch::kFloat32);
      dq = tail.query, dKey = tail.key, dBetaKeys = tail.betaKeys;
      (tail.decayGradient ? dDecay : dCum) = tail.cum;
      keysToEndSums = tail.keysToEndSums;
    }
#endif
    if (!dq.defined()) {
      // In place where it can (addcmul_): each [.., c, dk] fp32 pass costs
      // ~0.1 ms at 32 heads x 8K tokens.
      Tensor dkRows = dKeysBeta * bt;
      const auto [gamma, toEnd] = terms.decays(cum);
      dq = dqScores.addcmul(dQueryDecayed, gamma).mul_(scale);
      dKey = (dkColumns + dkRows).addcmul_(dXk, bt * gamma).addcmul_(dKeysToEnd, toEnd);
      dBetaKeys = (dKeysBeta * k).addcmul_(dXk, k * gamma).sum(-1, true);
      // The cumulative decay, per channel: every e^{+-G} factor, then the chunk's last G.
      Tensor keysToEndTerm = dKeysToEnd * terms.keysToEnd;
      dCum = (q * dqScores)
                 .addcmul_(k, dkRows - dkColumns)
                 .addcmul_(dQueryDecayed, queryDecayed)
                 .addcmul_(dXk, terms.keysWeighted)
                 .sub_(keysToEndTerm);
      keysToEndSums = keysToEndTerm.sum(3, true);
    }
    // The tail's inputs are dead: freed before the gradients' conversions to
    // the inputs' dtypes, which would otherwise sit on top of them.
    scoreGrads = PairedScoreGradients{};
    dQueryDecayed.reset(), dKeysToEnd.reset(), dXk.reset();
    Tensor dBeta = dBetaKeys + dBetaValues;
    if (!dDecay.defined())
      dDecay = decayGradient(dCum, keysToEndSums + leavingDotState * terms.last.exp());
    return chunkedGradients(dq, dKey, dValue, dDecay, dBeta, ds, t, dtypes);
  }
};

} // namespace

std::vector<Tensor> perChannelDecayDeltaRule(const DeltaRuleInputs &in, int64_t chunkSize, const Tensor &initialState,
                                             bool tf32) {
  const int64_t b = in.key.size(0), h = in.key.size(1), dk = in.key.size(3), dv = in.value.size(3);
  Tensor state = initialState.defined() ? initialState
                                        : torch::zeros({b, h, dk, dv}, in.value.options().dtype(torch::kFloat32));
  return KimiDeltaNode::apply(in.query, in.key, in.value, in.decay, in.beta, state, chunkSize, tf32);
}

} // namespace adapt::rt
