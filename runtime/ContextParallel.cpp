//===- ContextParallel.cpp - one sequence split across a CP group ---------===//

#include "runtime/ContextParallel.h"

namespace adapt::rt {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Collectives &groupAt(AutogradContext *ctx) {
  return *reinterpret_cast<Collectives *>(ctx->saved_data["group"].toInt());
}

/// Every rank's X stacked along a new first dimension; backward: the
/// gradient summed over the group, this rank's slice.
struct GatherParts : torch::autograd::Function<GatherParts> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x, int64_t groupAddress) {
    ctx->saved_data["group"] = groupAddress;
    auto &group = *reinterpret_cast<Collectives *>(groupAddress);
    return torch::stack(group.allGather(x.contiguous()));
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    Collectives &group = groupAt(ctx);
    std::vector<torch::Tensor> sum = {grads[0].contiguous().clone()};
    group.allReduceSum(sum);
    return {sum[0].select(0, group.rank()), torch::Tensor()};
  }
};

torch::Tensor gatherParts(const torch::Tensor &x, const ContextSplit &cp) {
  return GatherParts::apply(x, reinterpret_cast<int64_t>(cp.group));
}

/// Forward: the state rank-1 sent (anchor only ties the node into the
/// graph). Backward: sends the state's gradient to rank-1.
// Sends never wait here (Collectives::waitSends at the end of the step):
// only receives block, and rank c only ever waits for rank c-1 in the
// forward pass and for rank c+1 in the backward pass, so the waits cannot
// form a cycle whatever order autograd runs a layer's nodes in.
struct ReceiveState : torch::autograd::Function<ReceiveState> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &anchor, int64_t groupAddress,
                               std::vector<int64_t> shape, int64_t dtype, int64_t tag) {
    ctx->saved_data["group"] = groupAddress;
    ctx->saved_data["tag"] = tag;
    ctx->save_for_backward({anchor});
    Collectives &group = *reinterpret_cast<Collectives *>(groupAddress);
    return group.recv(shape,
                      torch::TensorOptions().dtype(static_cast<torch::ScalarType>(dtype)).device(anchor.device()),
                      group.rank() - 1, static_cast<int>(2 * tag));
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    Collectives &group = groupAt(ctx);
    group.send(grads[0].contiguous(), group.rank() - 1, static_cast<int>(2 * ctx->saved_data["tag"].toInt() + 1));
    torch::Tensor anchor = ctx->get_saved_variables()[0];
    return {torch::zeros_like(anchor), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

/// Forward: sends the state to rank+1, returns a zero scalar. Backward:
/// receives the state's gradient from rank+1.
struct SendState : torch::autograd::Function<SendState> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &state, int64_t groupAddress,
                               int64_t tag) {
    ctx->saved_data["group"] = groupAddress;
    ctx->saved_data["tag"] = tag;
    ctx->saved_data["shape"] = state.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(state.scalar_type());
    Collectives &group = *reinterpret_cast<Collectives *>(groupAddress);
    group.send(state.detach().contiguous(), group.rank() + 1, static_cast<int>(2 * tag));
    return torch::zeros({}, state.options());
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    Collectives &group = groupAt(ctx);
    std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    torch::Tensor g = group.recv(shape, grads[0].options().dtype(dtype), group.rank() + 1,
                                 static_cast<int>(2 * ctx->saved_data["tag"].toInt() + 1));
    return {g, torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor gatherEarlier(const torch::Tensor &x, int64_t dim, const ContextSplit &cp) {
  if (!cp.split())
    return x;
  std::vector<torch::Tensor> earlier = gatherParts(x, cp).narrow(0, 0, cp.rank + 1).unbind(0);
  return torch::cat(earlier, dim);
}

torch::Tensor gatherAll(const torch::Tensor &x, int64_t dim, const ContextSplit &cp) {
  if (!cp.split())
    return x;
  return torch::cat(gatherParts(x, cp).unbind(0), dim);
}

torch::Tensor stateFromPrevious(const torch::Tensor &anchor, const std::vector<int64_t> &shape,
                                const torch::TensorOptions &options, const ContextSplit &cp, int tag) {
  if (!cp.split() || cp.rank == 0)
    return torch::zeros(shape, options);
  return ReceiveState::apply(anchor, reinterpret_cast<int64_t>(cp.group), shape,
                             static_cast<int64_t>(c10::typeMetaToScalarType(options.dtype())), tag);
}

torch::Tensor passStateOn(const torch::Tensor &state, const ContextSplit &cp, int tag) {
  if (!cp.split() || cp.rank + 1 == cp.size)
    return torch::Tensor();
  return SendState::apply(state, reinterpret_cast<int64_t>(cp.group), tag);
}

} // namespace adapt::rt
