//===- ExpertParallel.cpp - routed experts split across ranks -------------===//

#include "runtime/ExpertParallel.h"
#include "runtime/ExpertRows.h"

#include <atomic>
#include <chrono>

namespace adapt::rt {

namespace {

/// Nanoseconds in all-to-alls (forward and backward), for the metrics.
std::atomic<int64_t> allToAllNanos{0};

torch::Tensor timedAllToAll(Collectives &group, const torch::Tensor &x,
                            const std::vector<int64_t> &send, const std::vector<int64_t> &recv) {
  auto start = std::chrono::steady_clock::now();
  torch::Tensor out = group.allToAll(x, send, recv);
  allToAllNanos += std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  return out;
}

/// The all-to-all as an autograd node.
struct AllToAllFunction : torch::autograd::Function<AllToAllFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &x,
                               int64_t groupAddress, std::vector<int64_t> send,
                               std::vector<int64_t> recv) {
    ctx->saved_data["group"] = groupAddress;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return timedAllToAll(*reinterpret_cast<Collectives *>(groupAddress), x, send, recv);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto *group = reinterpret_cast<Collectives *>(ctx->saved_data["group"].toInt());
    std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    // What came from member i goes back to it.
    return {timedAllToAll(*group, grads[0].contiguous(), recv, send), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor allToAllRows(const torch::Tensor &x, Collectives &group,
                           const std::vector<int64_t> &send, const std::vector<int64_t> &recv) {
  return AllToAllFunction::apply(x, reinterpret_cast<int64_t>(&group), send, recv);
}

double takeAllToAllSeconds() { return static_cast<double>(allToAllNanos.exchange(0)) * 1e-9; }

torch::Tensor dispatchToExperts(const torch::Tensor &rows, const torch::Tensor &counts,
                                const ExpertShard &shard, int64_t align,
                                const ExpertCompute &compute) {
  Collectives &group = *shard.group;
  const int64_t members = group.size(), local = shard.local;
  // Rows per (destination member, its local expert), and what each member
  // sends this one for each of its local experts.
  torch::Tensor sendCounts = counts.to(torch::kCPU, torch::kLong).view({members, local}).contiguous();
  torch::Tensor recvCounts = timedAllToAll(group, sendCounts, std::vector<int64_t>(members, 1),
                                           std::vector<int64_t>(members, 1));
  std::vector<int64_t> send(members), recv(members);
  auto sendAccess = sendCounts.accessor<int64_t, 2>();
  auto recvAccess = recvCounts.accessor<int64_t, 2>();
  std::vector<int64_t> expertOfReceived;
  for (int64_t m = 0; m < members; ++m)
    for (int64_t e = 0; e < local; ++e) {
      send[m] += sendAccess[m][e];
      recv[m] += recvAccess[m][e];
      expertOfReceived.insert(expertOfReceived.end(), recvAccess[m][e], e);
    }
  torch::Tensor received = allToAllRows(rows, group, send, recv);
  // Group the received rows by local expert, as the grouped GEMMs want: a
  // routing of one expert per row with weight 1 (padding rows get 0).
  const int64_t n = static_cast<int64_t>(expertOfReceived.size());
  Routing routing;
  routing.experts = torch::tensor(expertOfReceived, torch::kLong).view({n, 1}).to(rows.device());
  routing.weights = torch::ones({n, 1}, torch::TensorOptions().dtype(torch::kFloat32).device(rows.device()));
  ExpertGroups groups = groupByExpert(routing, local, align);
  torch::Tensor out = compute(dispatchTokens(received, groups), groups);
  torch::Tensor inReceivedOrder = combineExpertRows(out, groups, torch::Tensor());
  return allToAllRows(inReceivedOrder, group, recv, send);
}

} // namespace adapt::rt
