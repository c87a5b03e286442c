//===- LinearCrossEntropyTest.cpp - the fused loss never holds the logits -===//
//
// Values and gradients of linearCrossEntropySum are judged by the op stage
// (validation/opcheck/OpCheckLoss.cpp); this is its memory, the reason it
// exists (issue 17: never the [tokens, vocab] logits in fp32).
//
//===----------------------------------------------------------------------===//

#include "runtime/LinearCrossEntropy.h"
#include "runtime/tests/CpuMemory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace adapt::rt;

/// Between forward and backward the loss keeps the hidden states' gradient
/// (computed in the same pass, [N, hidden]) and the scalar; while it runs
/// it holds one chunk's fp32 logits and softmax, whatever N is. Counted on
/// the CPU at 512 and 2,048 rows of a 1,000-word vocabulary, chunks of 64
/// rows: kept exactly the gradient and the loss (+1 % for LibTorch's small
/// allocations); the transients are equal at both N: measured 2.0 chunk-sized
/// fp32 tiles (the logits and their softmax), bound 4. The whole logits
/// would be 2 and 8 MB.
TEST(LinearCrossEntropy, HoldsOneChunkOfLogitsNeverAllOfThem) {
  torch::manual_seed(41);
  const int64_t hidden = 32, vocab = 1000, chunk = 64;
  const int64_t tile = chunk * vocab * 4;
  torch::Tensor weight = torch::randn({vocab, hidden}) * 0.1;
  std::vector<int64_t> transients;
  for (int64_t rows : {512, 2048}) {
    torch::Tensor h = torch::randn({rows, hidden}).requires_grad_();
    torch::Tensor targets = torch::randint(vocab, {rows});
    test::CountCpuAllocations count;
    torch::Tensor loss = linearCrossEntropySum(h, weight, targets, chunk);
    const int64_t kept = count.liveBytes(), stated = rows * hidden * 4 + 4;
    EXPECT_GE(kept, stated) << rows;
    EXPECT_LE(kept, stated + stated / 100) << rows << " rows: kept " << kept << ", the gradient and the loss " << stated;
    transients.push_back(count.peakBytes() - kept);
    EXPECT_LE(transients.back(), 4 * tile) << rows << " rows";
  }
  EXPECT_EQ(transients[0], transients[1]); // nothing of the transients grows with N
}
