//===- OpsTest.cpp - the operator library's kernels ------------------------===//
//
// Properties that CPU CI can check for code whose fast path runs on GPUs:
// padded expert groups (the CUDA grouped-GEMM layout) compute exactly what
// unpadded ones do, forward and backward, and the grouped GEMM agrees with a
// per-expert loop.
//
//===----------------------------------------------------------------------===//

#include "runtime/Errors.h"
#include "runtime/Layers.h"
#include "runtime/Ops.h"
#include "runtime/tests/CpuMemory.h"
#include "runtime/tests/Margins.h"

#include <gtest/gtest.h>

using namespace adapt::rt;

namespace {

/// A MoE-style combine: rows grouped by expert, one grouped linear, weighted
/// scatter back to tokens.
torch::Tensor combine(const torch::Tensor &x, const torch::Tensor &w, const Routing &routing,
                      int64_t experts, int64_t align) {
  ExpertGroups g = groupByExpert(routing, experts, align);
  torch::Tensor rows = x.index_select(0, g.tokenOfRow);
  torch::Tensor out = groupedLinear(rows, w, g) * g.weightOfRow.unsqueeze(1);
  return torch::zeros({x.size(0), w.size(1)}).index_add(0, g.tokenOfRow, out);
}

} // namespace

/// Padded vs unpadded groups with output width \p width: 8 takes the grouped
/// GEMM kernel, 5 (20-byte rows) the per-expert fallback.
void checkPadding(int64_t width) {
  torch::manual_seed(3);
  const int64_t tokens = 37, experts = 6, k = 2;
  torch::Tensor logits = torch::randn({tokens, experts});
  FfnDef ffn;
  ffn.topK = k;
  ffn.normTopK = true;
  Routing routing = route(logits, ffn, {});
  torch::Tensor x1 = torch::randn({tokens, 8}, torch::requires_grad());
  torch::Tensor x2 = x1.detach().clone().requires_grad_(true);
  torch::Tensor w1 = torch::randn({experts, width, 8}, torch::requires_grad());
  torch::Tensor w2 = w1.detach().clone().requires_grad_(true);
  torch::Tensor plain = combine(x1, w1, routing, experts, 1);
  torch::Tensor padded = combine(x2, w2, routing, experts, 16);
  // The same products in other kernels (grouped GEMM with padding rows, or
  // per expert): fp32 reassociation only, measured <= 1e-7 relative; 1e-5 is
  // >= 100x that, and a misplaced or double-counted row is O(1).
  using adapt::rt::test::expectWithin, adapt::rt::test::relError;
  const std::string what = "padded groups, width " + std::to_string(width);
  expectWithin(what, relError(padded, plain), 1e-5);
  torch::Tensor grad = torch::randn_like(plain);
  plain.backward(grad);
  padded.backward(grad);
  expectWithin(what + " grad x", relError(x2.grad(), x1.grad()), 1e-5);
  expectWithin(what + " grad w", relError(w2.grad(), w1.grad()), 1e-5);
  ExpertGroups g = groupByExpert(routing, experts, 16);
  // Load counts stay the real tokens per expert; groups are padded.
  EXPECT_EQ(g.counts.sum().item<int64_t>(), tokens * k);
  EXPECT_EQ(g.tokenOfRow.size(0), tokens * k + experts * 15);
  EXPECT_EQ(g.offsets[experts - 1].item<int32_t>(), tokens * k + experts * 15);
  for (int64_t e = 0; e + 1 < experts; ++e)
    EXPECT_EQ(g.offsets[e].item<int32_t>() % 16, 0);
}

TEST(OpsTest, PaddedExpertGroupsMatchUnpaddedForwardAndBackward) {
  checkPadding(8);
  checkPadding(5);
}

TEST(OpsTest, GroupedLinearMatchesPerExpertMatmuls) {
  torch::manual_seed(4);
  torch::Tensor counts = torch::tensor({3, 0, 5, 2}, torch::kInt64);
  ExpertGroups g;
  g.counts = g.rowCounts = counts;
  g.offsets = counts.cumsum(0).to(torch::kInt32);
  torch::Tensor x = torch::randn({10, 8});
  torch::Tensor w = torch::randn({4, 6, 8});
  torch::Tensor y = groupedLinear(x, w, g);
  int64_t row = 0;
  for (int64_t e = 0; e < 4; ++e) {
    int64_t n = counts[e].item<int64_t>();
    if (n) // fp32 reassociation only (measured <= 1e-7); 1e-5 is >= 100x that
      adapt::rt::test::expectWithin("grouped linear expert " + std::to_string(e),
                                    adapt::rt::test::relError(y.narrow(0, row, n),
                                                              torch::matmul(x.narrow(0, row, n), w[e].t())),
                                    1e-5);
    row += n;
  }
}

TEST(OpsTest, SigmoidRouterKeepsOnlyTheBestGroups) {
  // 8 experts in 4 groups, 2 groups kept: experts outside them are never picked.
  torch::Tensor logits = torch::tensor({{5.f, 4.f, -5.f, -5.f, 3.f, 3.f, -5.f, -5.f}});
  FfnDef ffn;
  ffn.router = RouterKind::SigmoidTopK;
  ffn.topK = 2;
  ffn.groups = 4;
  ffn.topKGroups = 2;
  ffn.normTopK = true;
  ffn.routedScaling = 2.5;
  Routing r = route(logits, ffn, {});
  auto ids = r.experts.sort(-1);
  EXPECT_EQ(std::get<0>(ids)[0][0].item<int64_t>(), 0);
  EXPECT_EQ(std::get<0>(ids)[0][1].item<int64_t>(), 1);
  EXPECT_NEAR(r.weights.sum().item<float>(), 2.5f, 1e-5);
}

TEST(OpsTest, ForcedRoutingWeighsTheGivenExpertsLikeTheRouter) {
  // Forcing the router's own choice changes nothing, to the bit, for every
  // router kind; forcing other experts gives them their own scores' weights;
  // bad shapes and ids are refused naming the flag.
  torch::manual_seed(9);
  torch::Tensor logits = torch::randn({11, 8});
  torch::Tensor bias = torch::randn({8}) * 0.1;
  for (RouterKind kind : {RouterKind::SoftmaxTopK, RouterKind::SigmoidTopK, RouterKind::TopKSoftmax,
                          RouterKind::TopKSigmoidInput}) {
    FfnDef ffn;
    ffn.router = kind;
    ffn.topK = 2;
    ffn.normTopK = true;
    ffn.groups = kind == RouterKind::SigmoidTopK ? 4 : 1;
    ffn.topKGroups = 2;
    ffn.routedScaling = 1.5;
    Routing own = route(logits, ffn, bias);
    Routing same = routeForced(logits, ffn, bias, own.experts);
    EXPECT_TRUE(torch::equal(same.experts, own.experts));
    EXPECT_TRUE(torch::equal(same.weights, own.weights));
    EXPECT_EQ(routingDifferences(own, same).item<int64_t>(), 0);
    // Swap each token's experts for the next two ids: the weights follow.
    torch::Tensor other = (own.experts + 2) % 8;
    Routing forced = routeForced(logits, ffn, bias, other);
    EXPECT_TRUE(torch::equal(forced.experts, other));
    EXPECT_GT(routingDifferences(own, forced).item<int64_t>(), 0);
    torch::Tensor scores = kind == RouterKind::SoftmaxTopK    ? torch::softmax(logits, -1).gather(1, other)
                           : kind == RouterKind::SigmoidTopK ? torch::sigmoid(logits).gather(1, other)
                                                             : logits.gather(1, other);
    torch::Tensor expected = kind == RouterKind::TopKSoftmax      ? torch::softmax(scores, -1)
                             : kind == RouterKind::TopKSigmoidInput ? torch::sigmoid(scores)
                                                                    : scores / scores.sum(-1, true) * 1.5;
    EXPECT_TRUE(torch::allclose(forced.weights, expected, 1e-6, 0)); // one division's rounding apart
    EXPECT_THROW(routeForced(logits, ffn, bias, other.narrow(0, 0, 5)), RuntimeError);
    EXPECT_THROW(checkForcedExperts(other + 8, 8, "model.layers.0.mlp"), RuntimeError);
    EXPECT_THROW(checkForcedExperts(other - 8, 8, "model.layers.0.mlp"), RuntimeError);
    EXPECT_NO_THROW(checkForcedExperts(other, 8, "model.layers.0.mlp"));
  }
}

/// A LoRA linear (q/k/v/o, dense MLPs, shared experts) keeps, between
/// forward and backward, its output [T, out] and the rank-r product x A^T
/// [T, r], plus the factors cast to the activations' dtype (bf16: A [r, in]
/// and s B [out, r]); x and W are the caller's. Nothing else of size T x in
/// or T x out: the rank-r terms accumulate into the base output in place.
/// Counted on the CPU in bf16: exactly those bytes (+1 % for LibTorch's own
/// small allocations).
TEST(OpsTest, LoraLinearKeepsItsOutputAndTheRankRProductOnly) {
  torch::manual_seed(5);
  const int64_t tokens = 96, in = 64, out = 48, rank = 8;
  LoraLinear l;
  l.weight = (torch::randn({out, in}) / 8).to(torch::kBFloat16);
  l.loraA = torch::randn({rank, in}).requires_grad_();
  l.loraB = torch::randn({out, rank}).requires_grad_();
  l.scale = 2.0;
  torch::Tensor x = torch::randn({tokens, in}).to(torch::kBFloat16).requires_grad_();
  test::CountCpuAllocations count;
  torch::Tensor y = l.forward(x, /*training=*/true);
  const int64_t kept = count.liveBytes(), stated = 2 * (tokens * out + tokens * rank + rank * in + out * rank);
  EXPECT_GE(kept, stated);
  EXPECT_LE(kept, stated + stated / 100) << "kept " << kept << ", the output, x A^T and the cast factors " << stated;
}

/// Linears reading one input (q/k/v) as one node keep what each would keep
/// alone (its output, x A^T, the cast factors): the stacked down-projection
/// adds no [T, in] tensor. Counted on the CPU in bf16; the values are the
/// op stage's (linear.lora.shared_input, against float64).
TEST(OpsTest, SharedInputLinearsKeepTheirOutputsAndTheirRankRProducts) {
  torch::manual_seed(6);
  const int64_t tokens = 96, in = 64, rank = 8;
  const int64_t outs[3] = {64, 16, 32};
  LoraLinear l[3];
  int64_t stated = 0;
  for (int i = 0; i < 3; ++i) {
    l[i].weight = (torch::randn({outs[i], in}) / 8).to(torch::kBFloat16);
    l[i].loraA = torch::randn({rank, in}).requires_grad_();
    l[i].loraB = torch::randn({outs[i], rank}).requires_grad_();
    l[i].scale = 2.0;
    stated += 2 * (tokens * outs[i] + tokens * rank + rank * in + outs[i] * rank);
  }
  torch::Tensor x = torch::randn({tokens, in}).to(torch::kBFloat16).requires_grad_();
  test::CountCpuAllocations count;
  std::vector<torch::Tensor> y = LoraLinear::forwardShared({&l[0], &l[1], &l[2]}, x, /*training=*/true);
  EXPECT_GE(count.liveBytes(), stated);
  EXPECT_LE(count.liveBytes(), stated + stated / 100)
      << "kept " << count.liveBytes() << ", the outputs, x A^T and the cast factors " << stated;
}
