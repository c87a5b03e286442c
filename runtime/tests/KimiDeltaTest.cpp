//===- KimiDeltaTest.cpp - Kimi delta attention's backward in head slices -===//
//
// The Kimi node's backward holds dozens of [B, H, T, dk] fp32 tensors at
// once (22 GiB at 1 x 32 heads x 32K tokens on an H100), so for long
// sequences it runs over slices of the heads, each slice's intermediates
// freed before the next. The slices must give the gradients of one pass,
// and hold less at their peak.
//
//===----------------------------------------------------------------------===//

#include "runtime/ChunkedTensors.h"
#include "runtime/KimiDeltaFunction.h"
#include "runtime/tests/CpuMemory.h"
#include "runtime/tests/Margins.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <vector>

using namespace adapt::rt;

namespace {

/// The leaves of one run: q, k, v, the log decays, beta and the initial state.
std::vector<torch::Tensor> kimiLeaves(int64_t batch, int64_t heads, int64_t tokens, int64_t dk, int64_t dv) {
  namespace F = torch::nn::functional;
  const F::NormalizeFuncOptions unit = F::NormalizeFuncOptions().dim(-1);
  return {F::normalize(torch::randn({batch, heads, tokens, dk}), unit),
          F::normalize(torch::randn({batch, heads, tokens, dk}), unit),
          torch::randn({batch, heads, tokens, dv}),
          torch::log_sigmoid(torch::randn({batch, heads, tokens, dk}) + 3.0),
          torch::sigmoid(torch::randn({batch, heads, tokens})),
          torch::randn({batch, heads, dk, dv}) * 0.1};
}

/// The leaves' gradients under a fixed random loss on the output and the
/// final state, with ADAPT_KIMI_BACKWARD_SLICE_HEADS set to \p sliceHeads
/// (nullptr: unset), and the backward's peak CPU bytes in \p peak.
std::vector<torch::Tensor> kimiGradients(const std::vector<torch::Tensor> &values, const char *sliceHeads,
                                         int64_t *peak) {
  if (sliceHeads)
    setenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS", sliceHeads, 1);
  else
    unsetenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS");
  std::vector<torch::Tensor> leaves;
  for (const torch::Tensor &v : values)
    leaves.push_back(v.clone().requires_grad_());
  const DeltaRuleInputs in{leaves[0], leaves[1], leaves[2], leaves[3], leaves[4]};
  std::vector<torch::Tensor> r = perChannelDecayDeltaRule(in, /*chunkSize=*/16, leaves[5], /*tf32=*/false);
  torch::manual_seed(11);
  torch::Tensor loss = (r[0] * torch::randn(r[0].sizes())).sum() + (r[1] * torch::randn(r[1].sizes())).sum();
  {
    test::CountCpuAllocations count;
    loss.backward();
    *peak = count.peakBytes();
  }
  unsetenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS");
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor &l : leaves)
    grads.push_back(l.grad());
  return grads;
}

} // namespace

TEST(KimiDelta, BackwardInHeadSlicesMatchesOnePassAndPeaksLower) {
  torch::manual_seed(5);
  // 6 heads in slices of 4: the last slice is ragged; 200 tokens: 13 chunks
  // of 16, the last one partial.
  const std::vector<torch::Tensor> values = kimiLeaves(2, 6, 200, 16, 12);
  int64_t onePassPeak = 0, slicedPeak = 0, singlePeak = 0;
  const std::vector<torch::Tensor> whole = kimiGradients(values, nullptr, &onePassPeak);
  const std::vector<torch::Tensor> sliced = kimiGradients(values, "4", &slicedPeak);
  const std::vector<torch::Tensor> single = kimiGradients(values, "1", &singlePeak);
  const char *names[] = {"q", "k", "v", "decay", "beta", "initial state"};
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_TRUE(whole[i].defined() && sliced[i].defined() && single[i].defined()) << names[i];
    ASSERT_EQ(sliced[i].sizes(), whole[i].sizes()) << names[i];
    // The same per-head arithmetic in smaller batches: measured 0 (the CPU
    // GEMMs sum each head's products in the same order); the bound allows
    // a few fp32 ulps of reordering.
    test::expectWithin(std::string("kimi slices of 4, grad ") + names[i], test::relError(sliced[i], whole[i]), 1e-6);
    test::expectWithin(std::string("kimi slices of 1, grad ") + names[i], test::relError(single[i], whole[i]), 1e-6);
  }
  // What the slices are for: the backward's intermediates scale with the
  // heads in flight, the whole gradients written into do not. Measured
  // (allocation counts are deterministic): one pass 12.0 MB, slices of 4
  // 8.05 MB (0.67x), of 1 2.70 MB (0.22x); the bounds leave ~1.2x and 1.5x.
  EXPECT_LT(slicedPeak, onePassPeak * 8 / 10) << "slices of 4 peaked at " << slicedPeak << " bytes, one pass "
                                              << onePassPeak;
  EXPECT_LT(singlePeak, onePassPeak * 35 / 100) << "slices of 1 peaked at " << singlePeak << " bytes, one pass "
                                                << onePassPeak;
}

/// The slice size users get without the variable (docs/runtime.md): one pass
/// where training's usual shapes fit the 256 MiB budget, fewer heads as the
/// context grows, and a bad value named in the error.
TEST(KimiDelta, BackwardSlicesFollowTheMemoryBudget) {
  unsetenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS");
  // One [B, h, T, 128] fp32 tensor per head: B x T x 512 bytes.
  EXPECT_GE(kimiBackwardSliceHeads(/*batch=*/1, 8192, 128), 32) << "1 x 8K: all 32 heads in one pass";
  EXPECT_GE(kimiBackwardSliceHeads(/*batch=*/2, 4096, 128), 32) << "training's 2 x 4K: all 32 heads in one pass";
  EXPECT_EQ(kimiBackwardSliceHeads(/*batch=*/1, 32768, 128), 32) << "1 x 32K: 32 heads, 512 MiB a tensor";
  EXPECT_EQ(kimiBackwardSliceHeads(/*batch=*/2, 32768, 128), 16) << "2 x 32K: 16 heads";
  EXPECT_EQ(kimiBackwardSliceHeads(/*batch=*/1, 131072, 128), 8) << "1 x 128K: 8 heads";
  EXPECT_EQ(kimiBackwardSliceHeads(/*batch=*/1, int64_t(1) << 20, 128), 1) << "1M tokens: one head at a time";
  setenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS", "3", 1);
  EXPECT_EQ(kimiBackwardSliceHeads(1, 32768, 128), 3);
  for (const char *bad : {"0", "-2", "four", "3x"}) {
    setenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS", bad, 1);
    try {
      kimiBackwardSliceHeads(1, 32768, 128);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const c10::Error &e) {
      EXPECT_NE(std::string(e.what()).find("ADAPT_KIMI_BACKWARD_SLICE_HEADS"), std::string::npos) << e.what();
    }
  }
  unsetenv("ADAPT_KIMI_BACKWARD_SLICE_HEADS");
}

/// The backward's scaled query chunks come from one pass over the bf16
/// input (scaledChunks) instead of an fp32 copy scaled after: every value
/// must be the copy's times the scale, bit for bit, whole chunks or padded,
/// contiguous or a transposed view (the projections' layout).
TEST(KimiDelta, ScaledQueryChunksEqualTheFp32CopyTimesTheScale) {
  const double scale = 1.0 / std::sqrt(128.0);
  const torch::Tensor whole = torch::randn({2, 3, 128, 16}).to(torch::kBFloat16);
  const torch::Tensor padded = torch::randn({2, 3, 100, 16}).to(torch::kBFloat16);
  const torch::Tensor view = torch::randn({2, 128, 3, 16}).to(torch::kBFloat16).transpose(1, 2);
  for (const torch::Tensor &x : {whole, padded, view}) {
    const torch::Tensor got = scaledChunks(x, 64, scale), want = toChunks(x, 64) * scale;
    ASSERT_EQ(got.scalar_type(), torch::kFloat32);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(torch::equal(got, want)) << "max difference " << (got - want).abs().max().item<float>() << " for "
                                         << x.sizes();
  }
}
