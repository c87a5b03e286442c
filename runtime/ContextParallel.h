//===- ContextParallel.h - one sequence split across a CP group -*- C++ -*-===//
//
// Context parallelism splits every sequence of a batch into cp contiguous
// parts, one per rank of a context group: rank c holds positions
// [c * T/cp, (c + 1) * T/cp). Everything that works token by token (norms,
// projections, MLPs, experts) runs on the local part unchanged; what mixes
// positions needs the earlier parts:
//
// - softmax attention (GQA/MHA, MLA): every rank all-gathers the keys and
//   values of the ranks before it and itself, and its queries attend to them
//   with the causal mask shifted by its first position (gatherEarlier);
// - the delta rule: the recurrent state at the part boundary is all that
//   crosses. Rank c waits for rank c-1's leaving state, runs its part from
//   it and passes its own on (stateFromPrevious / passStateOn); the
//   backward pass sends each state's gradient back the same way (lightning,
//   whose decay is fixed, gathers its parts' states instead:
//   LightningLayer.cpp);
// - short causal convolutions read the last K-1 inputs of the previous part,
//   passed on the same way.
//
// Every operation here is differentiable. gatherEarlier is collective over
// the group, so all ranks call it in the same order (the same model on every
// rank guarantees it). The exchange with neighbours is point-to-point; its
// sends complete at the end of the step (Collectives::waitSends on the
// context group).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CONTEXTPARALLEL_H
#define ADAPT_RUNTIME_CONTEXTPARALLEL_H

#include "runtime/Distributed.h"

#include <torch/torch.h>

namespace adapt::rt {

/// Where this rank's part of the sequence lies. A null group: the whole
/// sequence is here (no context parallelism).
struct ContextSplit {
  Collectives *group = nullptr;
  int64_t rank = 0, size = 1;
  bool split() const { return group != nullptr && size > 1; }
  /// The first global position of a local part of \p localLength tokens.
  int64_t offset(int64_t localLength) const { return rank * localLength; }
};

/// The parts of ranks 0..rank of \p x along dimension \p dim, joined in
/// order (the keys and values this rank's queries may see). Backward: each
/// rank's part gets the sum of every rank's gradient for it.
torch::Tensor gatherEarlier(const torch::Tensor &x, int64_t dim, const ContextSplit &cp);

/// Every rank's part of \p x along \p dim, joined in order: the whole
/// sequence. Gradient as gatherEarlier's.
torch::Tensor gatherAll(const torch::Tensor &x, int64_t dim, const ContextSplit &cp);

/// The recurrent state (or any tensor: a convolution's last inputs) entering
/// this rank's part: zeros of \p shape on rank 0, on rank c what rank c-1
/// passed on under \p tag (passStateOn). \p anchor (any tensor
/// with a gradient in this layer) ties the exchange into the backward pass,
/// which sends the state's gradient back to rank c-1.
torch::Tensor stateFromPrevious(const torch::Tensor &anchor, const std::vector<int64_t> &shape,
                                const torch::TensorOptions &options, const ContextSplit &cp, int tag);

/// Sends \p state (this part's leaving state) to the next rank under \p tag
/// and returns a zero scalar that the caller adds to the layer's output: its
/// backward receives the next rank's gradient for the state. Undefined on
/// the last rank (nothing to send).
torch::Tensor passStateOn(const torch::Tensor &state, const ContextSplit &cp, int tag);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_CONTEXTPARALLEL_H
