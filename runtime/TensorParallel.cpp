//===- TensorParallel.cpp - projections split across a TP group -----------===//

#include "runtime/TensorParallel.h"

#include <atomic>
#include <chrono>

namespace adapt::rt {

namespace {

std::atomic<int64_t> tensorParallelNanos{0};

/// X summed over GROUP, as a new tensor.
torch::Tensor summed(const torch::Tensor &x, Collectives &group) {
  auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> parts = {x.contiguous().clone()};
  group.allReduceSum(parts);
  tensorParallelNanos += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  return parts[0];
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               int64_t groupAddress) {
    ctx->saved_data["group"] = groupAddress;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto *group = reinterpret_cast<Collectives *>(ctx->saved_data["group"].toInt());
    return {summed(grads[0], *group), torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext *, const torch::Tensor &x,
                               int64_t groupAddress) {
    return summed(x, *reinterpret_cast<Collectives *>(groupAddress));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

/// Sums over the group forward and backward: a statistic every rank's
/// output depends on (the gradient of each rank's use is summed back).
struct SumAcrossRegion : torch::autograd::Function<SumAcrossRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               int64_t groupAddress) {
    ctx->saved_data["group"] = groupAddress;
    return summed(x, *reinterpret_cast<Collectives *>(groupAddress));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto *group = reinterpret_cast<Collectives *>(ctx->saved_data["group"].toInt());
    return {summed(grads[0], *group), torch::Tensor()};
  }
};

} // namespace

torch::Tensor splitWidthRmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps, bool zeroCentred,
                                Collectives &group) {
  torch::Tensor h = x.to(torch::kFloat32);
  torch::Tensor squares = SumAcrossRegion::apply(h.pow(2).sum(-1, /*keepdim=*/true), reinterpret_cast<int64_t>(&group));
  h = h * torch::rsqrt(squares / static_cast<double>(x.size(-1) * group.size()) + eps);
  if (zeroCentred)
    return (h * (1.0 + weight.to(torch::kFloat32))).to(x.scalar_type());
  return weight.defined() ? weight * h.to(x.scalar_type()) : h.to(x.scalar_type());
}

torch::Tensor copyToTensorRegion(const torch::Tensor &x, Collectives &group) {
  return CopyToRegion::apply(x, reinterpret_cast<int64_t>(&group));
}

torch::Tensor reduceFromTensorRegion(const torch::Tensor &x, Collectives &group) {
  return ReduceFromRegion::apply(x, reinterpret_cast<int64_t>(&group));
}

double takeTensorParallelSeconds() {
  return static_cast<double>(tensorParallelNanos.exchange(0)) * 1e-9;
}

} // namespace adapt::rt
