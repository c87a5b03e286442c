//===- ExpertParallel.h - routed experts split across ranks ------*- C++ -*-===//
//
// Expert parallelism: each rank of an expert-parallel group holds E / ep of a
// MoE layer's routed experts (their weights and LoRA factors). After routing,
// every rank sends each (token, expert) row to the rank holding the expert
// (all-to-all, dropless: the row counts vary per rank and step), the experts
// run there on rows grouped by local expert, and a second all-to-all brings
// the results back. Both exchanges are differentiable: the backward of an
// all-to-all is the all-to-all with send and receive counts swapped.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_EXPERTPARALLEL_H
#define ADAPT_RUNTIME_EXPERTPARALLEL_H

#include "runtime/Distributed.h"
#include "runtime/Ops.h"

#include <torch/torch.h>

#include <functional>

namespace adapt::rt {

/// This rank's share of a MoE layer's routed experts.
struct ExpertShard {
  Collectives *group = nullptr; ///< The expert-parallel group; null: all local.
  int64_t first = 0;            ///< Global id of the first local expert.
  int64_t local = 0;            ///< Local experts (E / ep); 0: all.
  bool split() const { return group && group->size() > 1; }
};

/// Differentiable all-to-all of rows: blocks of SEND[i] rows of X to member
/// i, RECV[i] rows back from each (Collectives::allToAll).
torch::Tensor allToAllRows(const torch::Tensor &x, Collectives &group,
                           const std::vector<int64_t> &send, const std::vector<int64_t> &recv);

/// What runs on the rows that reach this rank: rows grouped by local expert
/// (GROUPS as groupByExpert makes them) -> their outputs.
using ExpertCompute = std::function<torch::Tensor(const torch::Tensor &, const ExpertGroups &)>;

/// Runs COMPUTE for ROWS [R, H] sorted by global expert, COUNTS [E] rows per
/// expert, on the ranks holding the experts; returns the outputs in ROWS'
/// order. ALIGN pads each local expert's group (groupByExpert).
torch::Tensor dispatchToExperts(const torch::Tensor &rows, const torch::Tensor &counts,
                                const ExpertShard &shard, int64_t align,
                                const ExpertCompute &compute);

/// Seconds spent in expert all-to-alls since the last call (then reset):
/// the trainer's per-step all-to-all time.
double takeAllToAllSeconds();

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_EXPERTPARALLEL_H
