//===- RecomputeTest.cpp - recompute() gives the gradients of a plain run -===//

#include "runtime/Recompute.h"
#include "runtime/tests/CpuMemory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace adapt::rt;

namespace {

/// A small "layer": x -> dropout(tanh(x W^T)) B^T with W frozen and B an
/// adapter, so the gradient must reach a captured tensor and the input.
struct Toy {
  torch::Tensor w = torch::randn({6, 5});
  torch::Tensor b = torch::randn({5, 6}).requires_grad_();
  torch::Tensor operator()(const torch::Tensor &x) const {
    return torch::dropout(torch::tanh(x.matmul(w.t())), 0.3, /*train=*/true).matmul(b.t());
  }
};

} // namespace

TEST(Recompute, SameValueAndGradientsAsAPlainForward) {
  torch::manual_seed(0);
  Toy toy;
  torch::Tensor x0 = torch::randn({4, 5});
  torch::Tensor cot = torch::randn({4, 5});

  torch::Tensor x = x0.clone().requires_grad_();
  torch::manual_seed(7);
  torch::Tensor plain = toy(x);
  plain.backward(cot);
  torch::Tensor gradX = x.grad().clone(), gradB = toy.b.grad().clone();
  toy.b.mutable_grad().zero_();

  torch::Tensor xr = x0.clone().requires_grad_();
  torch::manual_seed(7);
  torch::Tensor again = recompute([&](const torch::Tensor &in) { return toy(in); }, xr);
  // Dropout drew a mask: the same one must be drawn in the recomputation.
  EXPECT_TRUE(torch::equal(again, plain));
  torch::Tensor unrelated = torch::rand({3}); // moves the generator on
  (void)unrelated;
  again.backward(cot);
  EXPECT_TRUE(torch::allclose(xr.grad(), gradX, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(toy.b.grad(), gradB, 1e-6, 1e-6));
}

TEST(Recompute, AdaptersGetGradientsWhenTheInputNeedsNone) {
  torch::manual_seed(1);
  Toy toy;
  torch::Tensor x = torch::randn({3, 5}); // embeddings: no grad
  torch::Tensor y = recompute([&](const torch::Tensor &in) { return toy(in); }, x);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(toy.b.grad().defined());
  EXPECT_GT(toy.b.grad().abs().sum().item<double>(), 0.0);
}

TEST(Recompute, WithoutGradModeItIsThePlainFunction) {
  Toy toy;
  torch::NoGradGuard noGrad;
  torch::Tensor y = recompute([&](const torch::Tensor &in) { return in * 2; }, torch::ones({2}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, torch::full({2}, 2.0)));
}

/// What recompute() is for: between forward and backward it holds the
/// function's output and the generator state it restores for the second
/// run, nothing of the function's inside (x is the caller's). Counted on
/// the CPU: exactly those bytes (+1 % for LibTorch's small allocations); the
/// plain forward of the same function keeps its tanh output and dropout mask
/// too.
TEST(Recompute, HoldsOnlyTheOutputAndTheGeneratorState) {
  torch::manual_seed(3);
  Toy toy;
  torch::Tensor x = torch::randn({256, 5}).requires_grad_();
  const int64_t rngStateBytes = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  int64_t recomputed = 0, plain = 0;
  {
    test::CountCpuAllocations count;
    torch::Tensor out = recompute([&](const torch::Tensor &in) { return toy(in); }, x);
    recomputed = count.liveBytes();
  }
  {
    test::CountCpuAllocations count;
    torch::Tensor out = toy(x);
    plain = count.liveBytes();
  }
  const int64_t stated = 256 * 5 * 4 + rngStateBytes;
  EXPECT_GE(recomputed, stated);
  EXPECT_LE(recomputed, stated + stated / 100) << "kept " << recomputed << ", the output and generator state " << stated;
  EXPECT_GT(plain, recomputed + 256 * 6 * 4); // at least the tanh output more
}
