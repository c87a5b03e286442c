//===- OpCheckLoraLinear.cpp - a frozen linear with its LoRA adapter ------===//
//
// LoraLinear::forward, y = x W^T + b + s (x A^T) B^T, against float64:
// forward and the gradients of the input and both factors. Where the layer
// runs its one node (LoraGroupFunction: the rank-r terms accumulated in
// place) and where it keeps the composition (dropout in training), so both
// are judged. And LoraLinear::forwardShared: linears that read one input
// (q/k/v; gate/up) as one node, members with and without an adapter or a
// bias, judged on their concatenated outputs.
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

/// q/k/v-like members reading one x: q with LoRA, k without an adapter, v
/// with LoRA and a bias; the loss reads all three outputs.
Trial sharedInputTrial(const Ctx &c, int64_t T, int64_t in, int64_t r) {
  const int64_t outs[3] = {in, in / 4, in / 2};
  const double scales[3] = {1.75, 0.0, 0.5};
  Input x = input(c, torch::randn({2, T, in}, f64), true);
  std::vector<Input> w, A, B;
  for (int i = 0; i < 3; ++i) {
    w.push_back(input(c, torch::randn({outs[i], in}, f64) / std::sqrt(double(in)), false));
    A.push_back(input(c, torch::randn({r, in}, f64) / std::sqrt(double(in)), true, torch::kFloat32));
    B.push_back(input(c, torch::randn({outs[i], r}, f64) * 0.5, true, torch::kFloat32));
  }
  Input b = input(c, torch::randn({outs[2]}, f64) * 0.1, false);
  LoraLinear l[3];
  for (int i = 0; i < 3; ++i) {
    l[i].weight = w[i].ours, l[i].scale = scales[i];
    if (i != 1)
      l[i].loraA = A[i].ours, l[i].loraB = B[i].ours;
  }
  l[2].bias = b.ours;
  const std::vector<Tensor> y = LoraLinear::forwardShared({&l[0], &l[1], &l[2]}, x.ours, /*training=*/true);
  Tensor ours = torch::cat(y, -1);
  std::vector<Tensor> refs;
  for (int i = 0; i < 3; ++i) {
    Tensor r = torch::matmul(x.ref, w[i].ref.t());
    if (i != 1)
      r = r + scales[i] * torch::matmul(torch::matmul(x.ref, A[i].ref.t()), B[i].ref.t());
    refs.push_back(i == 2 ? r + b.ref : r);
  }
  Tensor ref = torch::cat(refs, -1);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}, {"q.lora_A", &A[0]}, {"q.lora_B", &B[0]}, {"v.lora_A", &A[2]}, {"v.lora_B", &B[2]}});
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
  addCheck(all, "linear.lora.shared_input", shapeText({{"T", 11}, {"in", 48}, {"r", 4}}),
           [](const Ctx &c) { return sharedInputTrial(c, 11, 48, 4); });
}

} // namespace adapt::rt::opcheck
