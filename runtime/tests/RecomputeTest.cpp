//===- RecomputeTest.cpp - recompute() gives the gradients of a plain run -===//

#include "runtime/Recompute.h"

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
