//===- OpCheckSparse.cpp - op-stage checks: DeepSeek sparse attention ===//
//
// Checks of DeepSeek sparse attention against float64 references written here.
//
// The reference indexer is the naive definition: for query t and visible key
// j <= t, score = sum_h w[t, h] * relu(scale * q[t, h] . k[j]), keep the
// min(k, t + 1) best. Equal scores (relu's zeros) make several selections
// correct, so the selection is judged by a verdict (the right count, visible
// keys only, nothing left out scoring above anything kept), and the attention
// reference is dense masked attention in float64 whose mask is the top-k
// selection: exp of the logit on selected visible keys, 0 elsewhere.
//
//===----------------------------------------------------------------------===//

#include "validation/opcheck/OpCheckHarness.h"

#include "runtime/SparseAttention.h"

namespace adapt::rt::opcheck {

namespace {

/// One sparse attention case.
struct SparseCase {
  int64_t B, H, KV, T, Dq, Dv; ///< Attention: heads, KV heads (H % KV == 0).
  int64_t indexHeads, indexDim, topK;
  int64_t queryBlock;          ///< Block size of both ops (odd: ragged last block).
  int64_t indexTile = int64_t(1) << 26; ///< The indexer's tile budget (its GPU path's block).
  /// The values are the keys' first Dv columns (sparseLatentAttention, MLA's
  /// shared latents): the keys' gradient carries both parts.
  bool valuesInKeys = false;
};

/// Float64 index scores [B, T, T] (-inf on future keys).
Tensor refIndexScores(const Tensor &q, const Tensor &k, const Tensor &w, double scale) {
  // q [B, H, T, D], k [B, T, D], w [B, T, H].
  Tensor perHead = torch::relu(torch::einsum("bhtd,bsd->bths", {q, k}) * scale); // [B, T, H, S]
  Tensor scores = torch::einsum("bth,bths->bts", {w, perHead});
  const int64_t T = q.size(2);
  Tensor future = torch::ones({T, T}, torch::kBool).triu(1);
  return scores.masked_fill(future, -kInf);
}

/// What is wrong with \p selection against the float64 \p scores, "" if
/// nothing: per query min(k, t + 1) distinct visible keys, and no visible key
/// left out scoring above a kept one beyond rounding: 1e-5 relative, plus
/// \p slack [B, T] per query (the bf16 GPU path's bound, sparseTrial).
std::string judgeSelection(const SparseSelection &selection, const Tensor &scores, int64_t topK,
                           const Tensor &slack) {
  Tensor idx = selection.indices.to(torch::kCPU, i64), valid = selection.valid.to(torch::kCPU);
  const int64_t B = scores.size(0), T = scores.size(1);
  if (idx.size(0) != B || idx.size(1) != T || idx.size(2) != std::min(topK, T))
    return "indices " + str(idx.sizes()) + ", expected [" + std::to_string(B) + ", " + std::to_string(T) + ", " +
           std::to_string(std::min(topK, T)) + "]";
  auto ia = idx.accessor<int64_t, 3>();
  auto va = valid.accessor<bool, 3>();
  auto sa = scores.accessor<double, 3>();
  auto sl = slack.accessor<double, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<bool> kept(T, false);
      int64_t count = 0;
      double worstKept = kInf, bestLeft = -kInf;
      for (int64_t s = 0; s < idx.size(2); ++s) {
        int64_t j = ia[b][t][s];
        if (j < 0 || j >= T)
          return "query " + std::to_string(t) + ": key " + std::to_string(j) + " out of range";
        if (va[b][t][s] != (j <= t))
          return "query " + std::to_string(t) + ": key " + std::to_string(j) + " marked " +
                 (va[b][t][s] ? "valid" : "invalid");
        if (!va[b][t][s])
          continue;
        if (kept[j])
          return "query " + std::to_string(t) + ": key " + std::to_string(j) + " kept twice";
        kept[j] = true;
        ++count;
        worstKept = std::min(worstKept, sa[b][t][j]);
      }
      if (count != std::min(topK, t + 1))
        return "query " + std::to_string(t) + ": " + std::to_string(count) + " keys kept, expected " +
               std::to_string(std::min(topK, t + 1));
      for (int64_t j = 0; j <= t; ++j)
        if (!kept[j])
          bestLeft = std::max(bestLeft, sa[b][t][j]);
      if (bestLeft > worstKept + 1e-5 * (1.0 + std::abs(worstKept)) + sl[b][t])
        return "query " + std::to_string(t) + ": a key scoring " + std::to_string(bestLeft) +
               " was left out while one scoring " + std::to_string(worstKept) + " was kept";
    }
  return "";
}

/// Dense float64 attention restricted to the selected keys of each query.
Tensor refSparseAttention(const Tensor &q, const Tensor &k, const Tensor &v, const SparseSelection &selection,
                          double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), groups = H / k.size(1);
  Tensor idx = selection.indices.to(torch::kCPU, i64);
  Tensor keep = torch::zeros({B, T, T}, torch::kBool).scatter(2, idx, selection.valid.to(torch::kCPU));
  keep = keep.logical_and(torch::ones({T, T}, torch::kBool).tril()); // causal, independently of `valid`
  Tensor kk = k.repeat_interleave(groups, 1), vv = v.repeat_interleave(groups, 1);
  Tensor logits = torch::matmul(q, kk.transpose(-1, -2)) * scale;
  logits = logits.masked_fill(keep.logical_not().unsqueeze(1), -kInf);
  Tensor probs = torch::softmax(logits, -1);
  return torch::matmul(probs, vv);
}

Trial sparseTrial(const Ctx &c, const SparseCase &s) {
  // The indexer: fp32 scores from inputs in the tested dtype.
  Input iq = input(c, torch::randn({s.B, s.indexHeads, s.T, s.indexDim}, f64), false);
  Input ik = input(c, torch::randn({s.B, s.T, s.indexDim}, f64), false);
  Input iw = input(c, torch::randn({s.B, s.T, s.indexHeads}, f64), false);
  const double indexScale = 1.0 / std::sqrt(double(s.indexDim));
  SparseSelection selection = lightningTopK(iq.ours, ik.ours, iw.ours, indexScale, s.topK, s.queryBlock, s.indexTile);
  Tensor scores = refIndexScores(iq.ref, ik.ref, iw.ref, indexScale);
  // bf16: the GPU path rounds each head's score to bf16 once (relative
  // 2^-8), so a key's index score moves by at most 2^-8 * sum_h |w_h|
  // relu(s_h), and two keys' order by twice the largest such sum of the query.
  Tensor slack = torch::zeros({s.B, s.T}, f64);
  if (c.dtype == torch::kBFloat16) {
    Tensor magnitude = refIndexScores(iq.ref, ik.ref, iw.ref.abs(), indexScale); // -inf on future keys
    slack = std::get<0>(magnitude.max(-1)) * std::ldexp(1.0, -7);
  }
  Trial t{verdict("selection", judgeSelection(selection, scores, s.topK, slack))};

  Input q = input(c, torch::randn({s.B, s.H, s.T, s.Dq}, f64), true);
  Input k = input(c, torch::randn({s.B, s.KV, s.T, s.Dq}, f64), true);
  const double scale = 1.0 / std::sqrt(double(s.Dq));
  if (s.valuesInKeys) {
    Tensor ours = sparseLatentAttention(q.ours, k.ours, s.Dv, selection, scale, s.queryBlock);
    Tensor ref = refSparseAttention(q.ref, k.ref, k.ref.narrow(-1, 0, s.Dv), selection, scale);
    t.push_back({"out", ours, ref});
    backward(t, ours, ref, {{"q", &q}, {"latents", &k}});
    return t;
  }
  Input v = input(c, torch::randn({s.B, s.KV, s.T, s.Dv}, f64), true);
  Tensor ours = sparseAttention(q.ours, k.ours, v.ours, selection, scale, s.queryBlock);
  Tensor ref = refSparseAttention(q.ref, k.ref, v.ref, selection, scale);
  t.push_back({"out", ours, ref});
  backward(t, ours, ref, {{"q", &q}, {"k", &k}, {"v", &v}});
  return t;
}

/// The indexer's RoPE relayout: rotating halves with relaid interleaved
/// tables equals rotating halves with tables built that way (and back).
Trial relayoutTrial(const Ctx &c, int64_t T, int64_t rotary) {
  RopeDef pairs, halves;
  pairs.rotaryDim = halves.rotaryDim = rotary;
  pairs.interleaved = true;
  pairs.scaling = halves.scaling = "yarn";
  pairs.factor = halves.factor = 4.0;
  pairs.originalMaxPositions = halves.originalMaxPositions = 16;
  pairs.mscaleAllDim = halves.mscaleAllDim = 0.707;
  RopeTables fromPairs = relayoutRope(ropeTables(pairs, T, c.device), true, false);
  RopeTables fromHalves = relayoutRope(ropeTables(halves, T, c.device), false, true);
  RopeTables wantHalves = ropeTables(halves, T, torch::kCPU), wantPairs = ropeTables(pairs, T, torch::kCPU);
  return {{"cos halves", fromPairs.cos, wantHalves.cos.to(f64)},
          {"sin halves", fromPairs.sin, wantHalves.sin.to(f64)},
          {"cos pairs", fromHalves.cos, wantPairs.cos.to(f64)},
          {"sin pairs", fromHalves.sin, wantPairs.sin.to(f64)}};
}

} // namespace

void addSparseAttentionChecks(std::vector<Check> &all) {
  auto sparse = [&](const char *id, SparseCase s) {
    std::string shape = shapeText({{"B", s.B}, {"H", s.H}, {"KV", s.KV}, {"T", s.T}, {"Dq", s.Dq}, {"Dv", s.Dv},
                                   {"Hi", s.indexHeads}, {"Di", s.indexDim}, {"k", s.topK}, {"blk", s.queryBlock}});
    addCheck(all, id, shape, [=](const Ctx &c) { return sparseTrial(c, s); });
  };
  // T > k: keys are dropped once t + 1 > k; ragged query blocks.
  sparse("sparse_attention.topk", {2, 4, 1, 37, 13, 11, 3, 10, 8, 7});
  sparse("sparse_attention.topk", {1, 6, 2, 67, 20, 16, 4, 12, 5, 16});
  sparse("sparse_attention.topk", {2, 3, 3, 29, 9, 7, 2, 6, 11, 64});
  // MLA's latent form: one shared KV head, keys wider than values.
  sparse("sparse_attention.latent", {1, 5, 1, 41, 24, 16, 4, 16, 6, 8});
  // The same with the values inside the keys, as the SparseMla layer calls it.
  sparse("sparse_attention.latent_shared", {1, 5, 1, 41, 24, 16, 4, 16, 6, 8, int64_t(1) << 26, true});
  sparse("sparse_attention.latent_shared", {2, 4, 2, 37, 13, 8, 3, 10, 8, 7, int64_t(1) << 26, true});
  // At the released latents' widths (576 = 512 + 64 rotary, values the first
  // 512), where bf16 on the GPU takes cuda::sparseLatentForward: 100 slots
  // (a tile of 64 and a ragged one), and 32 heads (two blocks of 16) over 40
  // slots with early queries' slots invalid.
  sparse("sparse_attention.latent_kernel", {1, 16, 1, 150, 576, 512, 4, 16, 100, 32, int64_t(1) << 26, true});
  sparse("sparse_attention.latent_kernel", {2, 32, 1, 70, 576, 512, 4, 16, 40, 16, int64_t(1) << 26, true});
  // T < k: every visible key is kept (k' = T).
  sparse("sparse_attention.short", {2, 4, 2, 5, 12, 10, 3, 8, 8, 2});
  sparse("sparse_attention.short", {1, 3, 1, 7, 11, 11, 2, 6, 7, 64});
  // One query per block.
  sparse("sparse_attention.topk", {1, 2, 1, 13, 8, 8, 2, 6, 4, 1});
  // The indexer over ragged blocks, keys cut at each block's last query on
  // the GPU. 12 heads of 40: the two-pass path (a [50, 12, 300] bf16 tile).
  sparse("sparse_attention.indexer_blocks", {2, 2, 1, 300, 8, 8, 12, 40, 40, 64, 12 * 300 * 50});
  // The one-kernel path (cuda::fusedIndexerScores) at the released widths,
  // 64 heads of 128 (DeepSeek-V3.2) and 32 of 64: blocks of 70 and 45
  // queries ([block, 300] fp32 tiles), key counts that end inside a tile.
  sparse("sparse_attention.indexer_fused", {1, 2, 1, 300, 8, 8, 64, 128, 40, 64, 2 * 300 * 70});
  sparse("sparse_attention.indexer_fused", {2, 2, 1, 200, 8, 8, 32, 64, 24, 16, 2 * 200 * 45});
  for (int64_t T : {7, 19})
    addCheck(all, "sparse_attention.rope_relayout", shapeText({{"T", T}, {"rot", 8}}),
             [=](const Ctx &c) { return relayoutTrial(c, T, 8); });
}

} // namespace adapt::rt::opcheck
