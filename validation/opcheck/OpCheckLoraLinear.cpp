//===- OpCheckLoraLinear.cpp - a frozen linear with its LoRA adapter ------===//
//
// LoraLinear::forward, y = x W^T + b + s (x A^T) B^T, against float64:
// forward and the gradients of the input and both factors. Where the layer
// runs its one node (LoraLinearFunction: the rank-r terms accumulated in
// place) and where it keeps the composition (dropout in training), so both
// are judged.
//
//===----------------------------------------------------------------------===//

#include "validation/opcheck/OpCheckHarness.h"

#include "runtime/Layers.h"

namespace adapt::rt::opcheck {

namespace {

Trial loraLinearTrial(const Ctx &c, int64_t T, int64_t in, int64_t out, int64_t r, bool bias, bool composition) {
  const double scale = 1.75;
  Input x = input(c, torch::randn({2, T, in}, f64), true);
  Input w = input(c, torch::randn({out, in}, f64) / std::sqrt(double(in)), false);
  Input b = input(c, torch::randn({out}, f64) * 0.1, false);
  Input A = input(c, torch::randn({r, in}, f64) / std::sqrt(double(in)), true, torch::kFloat32);
  Input B = input(c, torch::randn({out, r}, f64) * 0.5, true, torch::kFloat32);
  LoraLinear l;
  l.weight = w.ours, l.loraA = A.ours, l.loraB = B.ours, l.scale = scale;
  if (bias)
    l.bias = b.ours;
  // Dropout 1e-12 keeps the composition (and drops nothing that shows).
  if (composition)
    l.dropout = 1e-12;
  Tensor ours = l.forward(x.ours, /*training=*/true);
  Tensor ref = torch::matmul(x.ref, w.ref.t()) + scale * torch::matmul(torch::matmul(x.ref, A.ref.t()), B.ref.t());
  if (bias)
    ref = ref + b.ref;
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}, {"lora_A", &A}, {"lora_B", &B}});
  return t;
}

} // namespace

void addLoraLinearChecks(std::vector<Check> &all) {
  auto add = [&](int64_t T, int64_t in, int64_t out, int64_t r, bool bias, bool composition) {
    addCheck(all, composition ? "linear.lora.composition" : (bias ? "linear.lora.bias" : "linear.lora"),
             shapeText({{"T", T}, {"in", in}, {"out", out}, {"r", r}}),
             [=](const Ctx &c) { return loraLinearTrial(c, T, in, out, r, bias, composition); });
  };
  add(7, 24, 16, 4, false, false);
  add(13, 64, 40, 8, true, false);
  add(13, 64, 40, 8, false, true);
}

} // namespace adapt::rt::opcheck
