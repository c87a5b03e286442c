//===- RouterLogits.cpp - fp32 router logits by a bf16 tensor-core GEMM ---===//

#include "runtime/RouterLogits.h"

namespace adapt::rt {

namespace {

/// x [N, H] bf16 times w [E, H] bf16 transposed, fp32 out, fp32 sums.
torch::Tensor productFp32(const torch::Tensor &x, const torch::Tensor &w) {
  if (x.is_cuda())
    return at::mm(x, w.t(), torch::kFloat32);
  return at::mm(x.to(torch::kFloat32), w.to(torch::kFloat32).t()); // the same exact products
}

struct ExactRouterLogitsFunction : torch::autograd::Function<ExactRouterLogitsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               const torch::Tensor &weightBf16) {
    ctx->save_for_backward({weightBf16});
    return productFp32(x, weightBf16);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor w = ctx->get_saved_variables()[0];
    const torch::Tensor g = grads[0].to(torch::kFloat32);
    const torch::Tensor hi = g.to(torch::kBFloat16);
    const torch::Tensor lo = (g - hi.to(torch::kFloat32)).to(torch::kBFloat16);
    // [hi | lo] [W ; W]: one GEMM, fp32 sums, one rounding to bf16.
    torch::Tensor dx = at::mm(torch::cat({hi, lo}, 1), torch::cat({w, w}, 0));
    return {dx, torch::Tensor()};
  }
};

} // namespace

torch::Tensor exactBf16Weight(const torch::Tensor &weight) {
  if (!weight.defined() || !weight.is_floating_point())
    return torch::Tensor();
  torch::Tensor bf16 = weight.detach().to(torch::kBFloat16);
  return torch::equal(bf16.to(weight.scalar_type()), weight.detach()) ? bf16 : torch::Tensor();
}

torch::Tensor exactRouterLogits(const torch::Tensor &x, const torch::Tensor &weightBf16) {
  return ExactRouterLogitsFunction::apply(x.to(torch::kBFloat16), weightBf16);
}

} // namespace adapt::rt
