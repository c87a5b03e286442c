//===- SparseAttentionTest.cpp - the SparseMla layer's latent form --------===//
//
// sparseMlaForward runs MLA in its latent space (kv_b_proj absorbed). These
// tests compare it with the plain per-head MLA of transformers (keys and
// values expanded by kv_b_proj, with LoRA and LoRA dropout on kv_b_proj as
// PEFT applies them) over the same top-k selection, forward and gradients.
//
//===----------------------------------------------------------------------===//

#include "runtime/SparseAttention.h"
#include "runtime/tests/Margins.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace adapt::rt;

namespace {

constexpr int64_t kHidden = 16, kHeads = 3, kNope = 8, kRope = 4, kV = 6, kQRank = 10, kKvRank = 7;

LoraLinear linear(int64_t out, int64_t in) {
  LoraLinear l;
  l.weight = torch::randn({out, in}) / std::sqrt(double(in));
  return l;
}

AttentionLayer layer(bool indexerPairs) {
  AttentionLayer a;
  AttentionDef &d = a.def;
  d.kind = AttentionKind::SparseMla;
  d.heads = d.kvHeads = kHeads;
  d.qkNopeDim = kNope, d.qkRopeDim = kRope, d.headDim = kNope + kRope, d.vHeadDim = kV;
  d.qLoraRank = kQRank, d.kvLoraRank = kKvRank;
  d.rope.rotaryDim = kRope, d.rope.interleaved = true;
  d.indexer.heads = 2, d.indexer.headDim = 8, d.indexer.topK = 5, d.indexer.queryBlock = 4;
  d.indexer.ropeInterleaved = indexerPairs;
  a.qA = linear(kQRank, kHidden);
  a.qANorm = 1 + 0.1 * torch::randn({kQRank});
  a.qB = linear(kHeads * (kNope + kRope), kQRank);
  a.kvA = linear(kKvRank + kRope, kHidden);
  a.kvANorm = 1 + 0.1 * torch::randn({kKvRank});
  a.kvB = linear(kHeads * (kNope + kV), kKvRank);
  a.o = linear(kHidden, kHeads * kV);
  a.indexQ = linear(2 * 8, kQRank);
  a.indexK = linear(8, kHidden);
  a.indexKNorm = 1 + 0.1 * torch::randn({8});
  a.indexKNormBias = 0.1 * torch::randn({8});
  a.indexWeights = linear(2, kHidden);
  return a;
}

/// transformers' form: per-head keys and values from kv_b_proj (with its
/// LoRA and dropout), attention masked to the indexer's selection.
torch::Tensor expandedMla(const AttentionLayer &a, const torch::Tensor &x, const RopeTables &rope, bool training) {
  const AttentionDef &d = a.def;
  const int64_t B = x.size(0), T = x.size(1);
  const double eps = d.indexer.latentNormEps;
  torch::Tensor qResid = rmsNorm(a.qA.forward(x, training), a.qANorm, eps);
  torch::Tensor qs = a.qB.forward(qResid, training).view({B, T, kHeads, kNope + kRope}).transpose(1, 2);
  torch::Tensor q = torch::cat({qs.narrow(-1, 0, kNope), applyRope(qs.narrow(-1, kNope, kRope), rope, true)}, -1);
  torch::Tensor kv = a.kvA.forward(x, training);
  torch::Tensor c = rmsNorm(kv.narrow(-1, 0, kKvRank), a.kvANorm, eps);
  torch::Tensor kRot = applyRope(kv.narrow(-1, kKvRank, kRope).view({B, 1, T, kRope}), rope, true);
  // The selection first: it draws no random numbers, the LoRA dropout does.
  torch::Tensor selected;
  {
    torch::NoGradGuard noGrad;
    const SparseIndexerDef &ix = d.indexer;
    RopeTables t = relayoutRope(rope, true, ix.ropeInterleaved);
    torch::Tensor iq = applyRope(a.indexQ.forward(qResid, false).view({B, T, ix.heads, ix.headDim}).transpose(1, 2),
                                 t, ix.ropeInterleaved);
    torch::Tensor ik = torch::layer_norm(a.indexK.forward(x, false), {ix.headDim}, a.indexKNorm, a.indexKNormBias,
                                         ix.keyNormEps);
    ik = applyRope(ik.unsqueeze(1), t, ix.ropeInterleaved).squeeze(1);
    torch::Tensor w = a.indexWeights.forward(x, false) / std::sqrt(double(ix.heads));
    SparseSelection s = lightningTopK(iq, ik, w, 1.0 / std::sqrt(double(ix.headDim)), ix.topK, 3);
    selected = torch::zeros({B, T, T}, torch::kBool).scatter(2, s.indices, s.valid);
  }
  torch::Tensor kvFull = a.kvB.forward(c, training).view({B, T, kHeads, kNope + kV}).transpose(1, 2);
  torch::Tensor k = torch::cat({kvFull.narrow(-1, 0, kNope), kRot.expand({B, kHeads, T, kRope})}, -1);
  torch::Tensor v = kvFull.narrow(-1, kNope, kV);
  torch::Tensor logits = torch::matmul(q, k.transpose(-1, -2)) * a.softmaxScale();
  logits = logits.masked_fill(selected.logical_not().unsqueeze(1), -INFINITY);
  torch::Tensor out = torch::matmul(torch::softmax(logits, -1), v).transpose(1, 2).reshape({B, T, kHeads * kV});
  return a.o.forward(out, training);
}

void compare(bool indexerPairs, double dropout) {
  torch::manual_seed(7);
  AttentionLayer a = layer(indexerPairs);
  a.kvB.loraA = (0.3 * torch::randn({4, kKvRank})).requires_grad_(true);
  a.kvB.loraB = (0.3 * torch::randn({kHeads * (kNope + kV), 4})).requires_grad_(true);
  a.kvB.scale = 2.0;
  a.kvB.dropout = dropout;
  a.o.loraA = (0.3 * torch::randn({4, kHeads * kV})).requires_grad_(true);
  a.o.loraB = (0.3 * torch::randn({kHidden, 4})).requires_grad_(true);
  a.o.scale = 2.0;
  const int64_t T = 13;
  torch::Tensor x = torch::randn({2, T, kHidden});
  RopeTables rope = ropeTables(a.def.rope, T, torch::kCPU);
  torch::Tensor cot = torch::randn({2, T, kHidden});

  torch::manual_seed(11);
  torch::Tensor ours = sparseMlaForward(a, x, rope, /*training=*/true);
  torch::Tensor gA, gB, gO;
  ours.backward(cot);
  gA = a.kvB.loraA.grad().clone(), gB = a.kvB.loraB.grad().clone(), gO = a.o.loraA.grad().clone();
  for (torch::Tensor t : {a.kvB.loraA, a.kvB.loraB, a.o.loraA, a.o.loraB})
    t.mutable_grad().zero_();

  torch::manual_seed(11);
  torch::Tensor ref = expandedMla(a, x, rope, /*training=*/true);
  ref.backward(cot);
  // Two fp32 associations of the same sums (absorbed vs expanded kv_b):
  // measured <= 2.1e-7 here; 1e-5 is ~50x that, and a wrong absorption is O(1).
  using adapt::rt::test::expectWithin, adapt::rt::test::relError;
  expectWithin("sparse MLA absorbed vs expanded", relError(ours, ref), 1e-5);
  expectWithin("sparse MLA grad kv_b lora_A", relError(gA, a.kvB.loraA.grad()), 1e-5);
  expectWithin("sparse MLA grad kv_b lora_B", relError(gB, a.kvB.loraB.grad()), 1e-5);
  expectWithin("sparse MLA grad o lora_A", relError(gO, a.o.loraA.grad()), 1e-5);
}

} // namespace

TEST(SparseMla, LatentFormEqualsExpandedMlaWithKvBLora) {
  compare(/*indexerPairs=*/false, /*dropout=*/0.0);
  compare(/*indexerPairs=*/true, /*dropout=*/0.0);
}

TEST(SparseMla, LatentFormEqualsExpandedMlaWithLoraDropout) {
  compare(/*indexerPairs=*/false, /*dropout=*/0.4);
}

TEST(SparseMla, IndexerGetsNoGradient) {
  torch::manual_seed(3);
  AttentionLayer a = layer(false);
  a.indexQ.loraA = torch::randn({4, kQRank}).requires_grad_(true);
  a.indexQ.loraB = torch::randn({16, 4}).requires_grad_(true);
  a.indexQ.scale = 1.0;
  torch::Tensor x = torch::randn({1, 9, kHidden}, torch::requires_grad());
  sparseMlaForward(a, x, ropeTables(a.def.rope, 9, torch::kCPU), true).sum().backward();
  EXPECT_FALSE(a.indexQ.loraA.grad().defined());
  EXPECT_FALSE(a.indexQ.loraB.grad().defined());
  EXPECT_TRUE(x.grad().defined());
}
