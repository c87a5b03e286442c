//===- ParallelStep.h - what a training step adds in a parallel run -*- C++ -*-===//
//
// The pieces of a data- and expert-parallel step that the trainer calls:
// which slice of the global batch this rank trains on, gradient reduction
// (dense adapters summed over the data ranks, split expert adapters over the
// ranks holding the same experts), the global gradient norm, and moving
// adapter tensors between their per-rank shards and the whole tensors a
// checkpoint or a PEFT export holds. Whole tensors make checkpoints
// independent of the layout: a run saved with EP2 resumes alone or with EP4.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_PARALLELSTEP_H
#define ADAPT_RUNTIME_PARALLELSTEP_H

#include "runtime/Distributed.h"
#include "runtime/Model.h"

#include <torch/torch.h>

#include <vector>

namespace adapt::rt {

/// Rows [first, first + count) of the global batch that this data rank trains.
std::pair<int64_t, int64_t> batchSlice(const Distributed &run, int64_t globalBatch);

/// Sums every adapter's gradient over the ranks that share it: partial
/// gradients over the tensor-parallel group, then dense adapters (and TP
/// shards) over the data ranks, split experts over the ranks holding them.
void reduceGradients(const std::vector<AdapterTensor> &params, Distributed &run);

/// The L2 norm of all adapter gradients of the whole model (each expert or
/// tensor shard counted once, every pipeline stage's adapters), after
/// reduceGradients; identical on every rank. \p params: this stage's.
double globalGradNorm(const std::vector<AdapterTensor> &params, Distributed &run);

/// The whole tensor of which \p local (this rank's shard of \p adapter, or a
/// tensor shaped like it, e.g. an AdamW moment) is a part. Collective: every
/// rank of the expert group calls it, in the same order.
torch::Tensor gatherShard(const AdapterTensor &adapter, const torch::Tensor &local, Distributed *run);

/// Pipeline parallelism: every stage holds every adapter tensor but only its
/// own stage's are trained there. Replaces each of \p wholes (whole tensors
/// shaped like \p params' adapters, e.g. gathered values, moments or
/// gradients) by the owning stage's, on every stage (one all-reduce over the
/// pipeline group, the other stages adding zeros). Collective.
void assembleStages(const std::vector<AdapterTensor> &params, std::vector<torch::Tensor> &wholes,
                    Distributed *run);

/// ZeRO-1: which of \p trained this rank steps and keeps AdamW state for.
/// Each tensor's replicas (the data group for dense adapters, the
/// expert-data group for expert shards) share its work: tensors go, largest
/// first, to the member with the fewest elements so far, the same choice on
/// every member. Alone: every tensor.
std::vector<bool> optimizerOwners(const std::vector<AdapterTensor> &trained, Distributed *run);

/// Replaces each of \p values (one per \p trained tensor, shaped like its
/// shard) by the owner's (optimizerOwners) on every replica: one all-reduce
/// per replica group, the others adding zeros. Used after the owners stepped
/// (the new adapter values) and to assemble the AdamW moments of a
/// checkpoint. Collective.
void shareFromOwners(const std::vector<AdapterTensor> &trained, const std::vector<bool> &owned,
                     std::vector<torch::Tensor> &values, Distributed *run);

/// This rank's shard of \p whole (shaped like the full adapter).
torch::Tensor shardOf(const AdapterTensor &adapter, const torch::Tensor &whole, const Distributed *run);

/// The full shape of \p adapter (its shard's shape when not split).
std::vector<int64_t> wholeShape(const AdapterTensor &adapter, const Distributed *run);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_PARALLELSTEP_H
