//===- LinearLayersTest.cpp - delta-rule mixers in recomputed segments ----===//
//
// A long sequence runs through a Gated DeltaNet or Kimi delta layer in
// segments, each recomputed in the backward pass from its input and the
// convolution tail and state entering it. The segments must give the values
// and gradients (input and every LoRA factor) of one pass over the sequence,
// including a last segment shorter than the convolution's tail.
//
//===----------------------------------------------------------------------===//

#include "runtime/LinearLayers.h"
#include "runtime/tests/Margins.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace adapt::rt;
using adapt::rt::test::expectWithin;
using adapt::rt::test::relError;

namespace {

constexpr int64_t kHidden = 24, kRank = 2;

/// A frozen projection with a LoRA adapter whose B is not zero, so the
/// adapter changes the output and every factor gets a gradient.
LoraLinear adapted(int64_t out, int64_t in) {
  LoraLinear l;
  l.weight = torch::randn({out, in}) * 0.3;
  l.loraA = (torch::randn({kRank, in}) * 0.3).requires_grad_();
  l.loraB = (torch::randn({out, kRank}) * 0.3).requires_grad_();
  l.scale = 1.0;
  return l;
}

LinearAttentionDef deltaDef(int64_t keyHeads, int64_t valueHeads, int64_t dk, int64_t dv) {
  LinearAttentionDef d;
  d.keyHeads = keyHeads, d.valueHeads = valueHeads, d.keyHeadDim = dk, d.valueHeadDim = dv;
  d.convKernel = 4, d.chunkSize = 8, d.segmentTokens = 0;
  return d;
}

/// Qwen3-Next's layout: 2 key heads of 8, 4 value heads of 6.
GatedDeltaNetLayer gatedDeltaNet() {
  GatedDeltaNetLayer g;
  g.def = deltaDef(2, 4, 8, 6);
  g.inProjQkvz = adapted(2 * (2 * 8 + 2 * 2 * 6), kHidden);
  g.inProjBa = adapted(2 * 2 * 2, kHidden);
  g.outProj = adapted(kHidden, 4 * 6);
  g.conv = torch::randn({2 * 16 + 24, 1, 4}) * 0.5;
  g.aLog = torch::log(torch::rand({4}) * 4 + 1);
  g.dtBias = torch::rand({4});
  g.norm = torch::rand({6}) + 0.5;
  return g;
}

/// Kimi-Linear's layout: 2 heads of 8, per-channel decay.
KimiDeltaLayer kimiDelta() {
  KimiDeltaLayer k;
  k.def = deltaDef(2, 2, 8, 8);
  for (LoraLinear *l : {&k.q, &k.k, &k.v})
    *l = adapted(16, kHidden);
  k.fA = adapted(8, kHidden), k.fB = adapted(16, 8);
  k.b = adapted(2, kHidden);
  k.gA = adapted(8, kHidden), k.gB = adapted(16, 8);
  k.o = adapted(kHidden, 16);
  k.conv = torch::randn({48, 1, 4}) * 0.5;
  k.aLog = torch::log(torch::rand({2}) * 4 + 1);
  k.dtBias = torch::rand({16});
  k.norm = torch::rand({8}) + 0.5;
  return k;
}

/// The output and the gradients of x and of every LoRA factor for a fixed
/// cotangent, with the layer's segment length set to \p segmentTokens.
template <typename Layer>
std::vector<torch::Tensor> valueAndGradients(Layer layer, const torch::Tensor &x0, const torch::Tensor &cot,
                                             int64_t segmentTokens) {
  layer.def.segmentTokens = segmentTokens;
  for (LoraLinear *l : layer.linears())
    for (torch::Tensor *t : {&l->loraA, &l->loraB})
      if (t->grad().defined())
        t->mutable_grad().zero_();
  torch::Tensor x = x0.clone().requires_grad_();
  torch::Tensor out = layer.forward(x, /*training=*/true);
  out.backward(cot);
  std::vector<torch::Tensor> all{out.detach(), x.grad().clone()};
  for (LoraLinear *l : layer.linears())
    for (torch::Tensor *t : {&l->loraA, &l->loraB})
      all.push_back(t->grad().clone());
  return all;
}

/// Segments of 16 tokens (two chunks) over 66 tokens: four whole segments
/// and a last one of 2 tokens, shorter than the convolution's tail of 3.
/// fp32 throughout; segmenting changes which tensors the chunk GEMMs are
/// batched over, not the chunk boundaries, so the results agree to a few
/// fp32 roundings. Measured (ADAPT_PRINT_MARGINS=1): 8e-8 to 6e-7 relative;
/// bound 1e-5 (17x over the worst, a LoRA gradient). A state or tail not
/// carried across a boundary moves the results by O(1).
template <typename Layer> void expectSegmentsMatchOnePass(const Layer &layer, const std::string &name) {
  torch::Tensor x = torch::randn({2, 66, kHidden});
  torch::Tensor cot = torch::randn({2, 66, kHidden});
  const std::vector<torch::Tensor> whole = valueAndGradients(layer, x, cot, 0);
  const std::vector<torch::Tensor> segmented = valueAndGradients(layer, x, cot, 16);
  ASSERT_EQ(whole.size(), segmented.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const std::string what = name + (i == 0 ? " output" : i == 1 ? " input gradient" : " LoRA gradient " +
                                                                                           std::to_string(i - 2));
    ASSERT_GT(whole[i].abs().max().item<double>(), 0.0) << what; // every gradient reaches its tensor
    expectWithin(what, relError(segmented[i], whole[i]), 1e-5);
  }
  // Without grad mode the segments still run one after another (bounded
  // memory at inference lengths), with the same values.
  torch::NoGradGuard noGrad;
  Layer copy = layer;
  copy.def.segmentTokens = 16;
  expectWithin(name + " output without grad", relError(copy.forward(x, false), whole[0]), 1e-5);
}

} // namespace

TEST(LinearLayers, GatedDeltaNetSegmentsMatchOnePass) {
  torch::manual_seed(3);
  expectSegmentsMatchOnePass(gatedDeltaNet(), "gated deltanet");
}

TEST(LinearLayers, KimiDeltaSegmentsMatchOnePass) {
  torch::manual_seed(4);
  expectSegmentsMatchOnePass(kimiDelta(), "kimi delta");
}
