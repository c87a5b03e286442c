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

} // namespace

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
