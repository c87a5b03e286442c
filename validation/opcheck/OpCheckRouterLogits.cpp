//===- OpCheckRouterLogits.cpp - the router's logits by a bf16 GEMM -------===//
//
// The MoE router's fp32 logits as the layer computes them (FfnLayer::
// routerLogits) against float64 x W^T, forward and the tokens' gradient.
// bf16 hidden states take the exact tensor-core node of RouterLogits.h (its
// weight is bf16-exact, as checkpoints store it); float32 ones the fp32
// product, and the check says which one it judged.
//
//===----------------------------------------------------------------------===//

#include "validation/opcheck/OpCheckHarness.h"

#include "runtime/Layers.h"

namespace adapt::rt::opcheck {

namespace {

Trial routerLogitsTrial(const Ctx &c, int64_t N, int64_t H, int64_t E, bool bias) {
  Input x = input(c, torch::randn({N, H}, f64), true);
  // The weight as a checkpoint stores it (bf16 values), held in fp32 as the runtime loads routers.
  Input w = input(c, (torch::randn({E, H}, f64) / std::sqrt(double(H))).to(torch::kBFloat16).to(f64), false,
                  torch::kFloat32);
  Input b = input(c, torch::randn({E}, f64) * 0.1, false, torch::kFloat32);
  FfnLayer layer;
  layer.def.experts = E, layer.def.topK = 1;
  layer.router.weight = w.ours;
  if (bias)
    layer.router.bias = b.ours;
  if (!layer.prepareRouter())
    return {verdict("prepare", "prepareRouter refused a frozen, bf16-exact router weight")};
  Tensor ours = layer.routerLogits(x.ours, /*training=*/true);
  Tensor ref = torch::matmul(x.ref, w.ref.t());
  if (bias)
    ref = ref + b.ref;
  Trial t{{"logits", ours, ref}};
  if (ours.scalar_type() != torch::kFloat32)
    t.push_back(verdict("logits dtype", std::string("expected float32 logits, got ") + c10::toString(ours.scalar_type())));
  backward(t, ours, ref, {{"x", &x}});
  return t;
}

} // namespace

void addRouterLogitsChecks(std::vector<Check> &all) {
  auto add = [&](int64_t N, int64_t H, int64_t E, bool bias) {
    addCheck(all, bias ? "route.logits.bias" : "route.logits", shapeText({{"N", N}, {"H", H}, {"E", E}}),
             [=](const Ctx &c) { return routerLogitsTrial(c, N, H, E, bias); },
             [](torch::ScalarType t, torch::Device) {
               return std::string(t == torch::kBFloat16 ? " [bf16 exact]" : " [fp32 product]");
             });
  };
  add(13, 24, 8, false);
  add(37, 64, 16, true);
  // The real router's width over few tokens: 128 experts, a 2,048-wide sum.
  add(33, 2048, 128, false);
}

} // namespace adapt::rt::opcheck
