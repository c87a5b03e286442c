//===- Pipeline.h - a pipeline-parallel training step (1F1B) ----*- C++ -*-===//
//
// Pipeline parallelism splits the decoder layers into pp contiguous stages
// (runtime/ModelCost.h's pipelineBoundaries balances their FLOPs), one per
// rank of a pipeline group. A step's micro-batches flow through the stages:
// each stage receives the previous stage's output, runs its layers and sends
// its output on; the backward pass sends the gradient of each stage's input
// back. The schedule is 1F1B (PipeDream-flush, as Megatron runs it): stage s
// runs pp - s - 1 forwards to fill the pipeline, then alternates one forward
// and one backward, then drains the remaining backwards, so at most pp - s
// micro-batches' activations are alive on it at once.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_PIPELINE_H
#define ADAPT_RUNTIME_PIPELINE_H

#include "runtime/Distributed.h"
#include "runtime/Model.h"

#include <torch/torch.h>

namespace adapt::rt {

/// Time a pipeline step spent waiting, for metrics.jsonl.
struct PipelineTimes {
  double waitSeconds = 0.0; ///< Blocked receiving activations or gradients (the bubble plus transfers).
};

/// One step's forward and backward passes of this rank's stage over
/// \p micro equal micro-batches of \p ids and \p labels (this data rank's
/// rows, [B, T]), each micro-batch's loss summed and divided by
/// \p globalCount (the global batch's target tokens), so the gradients left
/// on this stage's adapters are the whole batch's. Returns the sum of the
/// loss shares on the last stage and 0 on the others.
double pipelineStep(Model &model, const torch::Tensor &ids, const torch::Tensor &labels, int64_t micro,
                    double globalCount, Distributed &run, PipelineTimes &times);

/// The order in which stage \p stage of \p stages runs its \p micro
/// micro-batches: +m+1 for the forward of micro-batch m, -(m+1) for its
/// backward (1F1B).
std::vector<int64_t> oneForwardOneBackward(int64_t stage, int64_t stages, int64_t micro);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_PIPELINE_H
