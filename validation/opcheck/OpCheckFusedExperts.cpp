//===- OpCheckFusedExperts.cpp - the fused routed-experts node ------------===//
//
// The routed experts' MLP with LoRA folded into the grouped GEMMs
// (runtime/FusedExperts.h) against a float64 loop over tokens with each
// expert's effective weights W + s B A: dispatch, gate_up, SwiGLU, down and
// the weighted combine, forward and the gradients of the tokens, the four
// LoRA factors and the routing weights. Where the node does not cover the
// device and dtype (fp32 on CUDA) the layer runs its composition, and the
// check says which one it judged.
//
//===----------------------------------------------------------------------===//

#include "validation/opcheck/OpCheckHarness.h"

#include "runtime/ExpertRows.h"
#include "runtime/FusedExperts.h"

namespace adapt::rt::opcheck {

namespace {

/// N tokens of width K routed to k of E experts of width I, LoRA rank r.
struct FusedExpertCase {
  int64_t N, E, k, K, I, r, align;
};

/// PEFT-layout factors of one expert projection [E, out, in]: A [E*r, in],
/// B [out, r*E] (column k*E + e), fp32 masters.
struct Factors {
  Input A, B;
};

Factors factors(const Ctx &c, int64_t E, int64_t r, int64_t out, int64_t in) {
  return {input(c, torch::randn({E * r, in}, f64) * (0.5 / std::sqrt(double(in))), true, torch::kFloat32),
          input(c, torch::randn({out, r * E}, f64) * 0.5, true, torch::kFloat32)};
}

/// W_e + s B_e A_e in float64.
Tensor effective(const Tensor &w, const Factors &f, int64_t e, int64_t E, int64_t r, double s) {
  std::vector<int64_t> cols;
  for (int64_t j = 0; j < r; ++j)
    cols.push_back(j * E + e);
  return w.select(0, e) + s * torch::matmul(f.B.ref.index_select(1, indices(cols)), f.A.ref.narrow(0, e * r, r));
}

Trial fusedExpertTrial(const Ctx &c, const FusedExpertCase &x) {
  const double scale = 1.5;
  Input tokens = input(c, torch::randn({x.N, x.K}, f64), true);
  Input w1 = input(c, torch::randn({x.E, 2 * x.I, x.K}, f64) / std::sqrt(double(x.K)), false);
  Input w2 = input(c, torch::randn({x.E, x.K, x.I}, f64) / std::sqrt(double(x.I)), false);
  Input wt = input(c, torch::rand({x.N, x.k}, f64) * 0.75 + 0.25, true, torch::kFloat32);
  Factors f1 = factors(c, x.E, x.r, 2 * x.I, x.K), f2 = factors(c, x.E, x.r, x.K, x.I);
  std::vector<Tensor> picks;
  for (int64_t n = 0; n < x.N; ++n)
    picks.push_back(torch::randperm(x.E, i64).narrow(0, 0, x.k));
  Tensor idx = torch::stack(picks);

  FfnLayer layer;
  layer.def.experts = x.E, layer.def.topK = x.k, layer.def.intermediate = x.I;
  layer.gateUp = ExpertLinear{w1.ours, Tensor(), f1.A.ours, f1.B.ours, scale};
  layer.expertDown = ExpertLinear{w2.ours, Tensor(), f2.A.ours, f2.B.ours, scale};
  ExpertGroups g = groupByExpert(Routing{idx.to(c.device), wt.ours}, x.E, x.align);
  Tensor ours;
  if (prepareFusedExperts(layer)) {
    ours = fusedRoutedExperts(layer, tokens.ours, g, wt.ours);
  } else { // the layer's composition
    Tensor h = layer.gateUp.forward(dispatchTokens(tokens.ours, g), g);
    ours = combineExpertRows(layer.expertDown.forward(gatedActivation(h, false, layer.def), g), g, wt.ours);
  }

  std::vector<Tensor> up, down;
  for (int64_t e = 0; e < x.E; ++e) {
    up.push_back(effective(w1.ref, f1, e, x.E, x.r, scale));
    down.push_back(effective(w2.ref, f2, e, x.E, x.r, scale));
  }
  std::vector<Tensor> out;
  for (int64_t n = 0; n < x.N; ++n) {
    Tensor acc = torch::zeros({x.K}, f64);
    for (int64_t j = 0; j < x.k; ++j) {
      const int64_t e = idx[n][j].item<int64_t>();
      Tensor h = torch::mv(up[e], tokens.ref[n]);
      Tensor act = torch::silu(h.narrow(0, 0, x.I)) * h.narrow(0, x.I, x.I);
      acc = acc + wt.ref[n][j] * torch::mv(down[e], act);
    }
    out.push_back(acc);
  }
  Tensor ref = torch::stack(out);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref,
           {{"x", &tokens}, {"gate_up lora_A", &f1.A}, {"gate_up lora_B", &f1.B}, {"down lora_A", &f2.A},
            {"down lora_B", &f2.B}, {"weights", &wt}});
  return t;
}

} // namespace

void addFusedExpertChecks(std::vector<Check> &all) {
  auto add = [&](const FusedExpertCase &x) {
    addCheck(all, "expert_mlp.lora_fused",
             shapeText({{"N", x.N}, {"E", x.E}, {"k", x.k}, {"K", x.K}, {"I", x.I}, {"r", x.r}, {"align", x.align}}),
             [=](const Ctx &c) { return fusedExpertTrial(c, x); }, [](torch::ScalarType t, torch::Device d) {
               const bool fused = d.is_cpu() || t == torch::kBFloat16;
               return std::string(fused ? " [fused]" : " [composition]");
             });
  };
  add({13, 5, 2, 24, 16, 8, 1});
  add({13, 5, 2, 24, 16, 8, 16});
  // Rank 16 over several 64-row tiles of the low-rank kernel, an expert left idle by chance.
  add({150, 6, 3, 32, 40, 16, 16});
}

} // namespace adapt::rt::opcheck
