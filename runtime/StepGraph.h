//===- StepGraph.h - a training step replayed as one CUDA graph -*- C++ -*-===//
//
// A single-process CUDA step (forward, backward, gradient clipping, AdamW) is
// thousands of small kernels. On the H200 the host issues them more slowly
// than the GPU runs them: ~2 ms of idle GPU per MoE layer at 2 x 4096 tokens
// (docs/performance.md, issue 17). StepGraph captures one whole step once
// and replays it for every later step, so the GPU gets the step at once.
//
// What the captured step needs, and how it gets it:
// - Fixed shapes: the batch is copied into buffers the graph reads. A batch
//   of another shape (it does not happen with packed windows) runs eagerly.
// - No host synchronisation inside the step: the bf16 grouped-GEMM MoE path
//   and the fused kernels have none. Where one is left (an fp32 per-expert
//   loop, forced routing's checks), capture fails and the run stays eager,
//   with one line saying why.
// - The optimizer's learning rate and step count on the device: AdamW runs
//   as ATen's fused kernel over the torch::optim::AdamW state's own tensors
//   (exp_avg, exp_avg_sq), whose host step count is kept in step, so
//   checkpoints and eager steps see the same state.
// - Gradient clipping on the device: clip_grad_norm_'s rule (coefficient
//   max_norm / (norm + 1e-6), applied when below 1), with the norm in fp32.
//   A non-finite loss or norm skips the update inside the graph (the fused
//   kernel's found_inf), and the trainer stops as in an eager step.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_STEPGRAPH_H
#define ADAPT_RUNTIME_STEPGRAPH_H

#include "runtime/Dataset.h"

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace adapt::rt {

class Model;

/// One captured training step of a single-process CUDA run.
class StepGraph {
public:
  /// What a replayed step measured (read back after the replay).
  struct Result {
    double loss = 0.0;
    double gradNorm = 0.0;
  };

  /// Whether this build can capture graphs (a CUDA LibTorch).
  static bool available();

  /// Captures one step over buffers shaped like \p batch and runs it (the
  /// capture itself computes nothing, so the step is replayed once). \p
  /// params are the trained tensors, all owned by \p optimizer (its one
  /// parameter group's options give betas, eps and weight decay); \p
  /// maxNorm is the clipping bound (infinity: none). Returns null when the
  /// step cannot be captured, with the reason in \p why (the exception's
  /// text, C++ stack trace included where LibTorch adds one); the run is then
  /// eager, its gradients cleared.
  static std::unique_ptr<StepGraph> capture(Model &model, torch::optim::AdamW &optimizer,
                                            std::vector<torch::Tensor> params, const Batch &batch,
                                            double lr, double maxNorm, Result &first, std::string &why);
  ~StepGraph();

  /// Whether \p batch has the captured shapes (and no images).
  bool fits(const Batch &batch) const;
  /// Runs one step on \p batch at learning rate \p lr (batch must fit).
  Result run(const Batch &batch, double lr);
  /// After an eager step in between (a batch that did not fit): points the
  /// parameters' gradients back at the graph's and takes the optimizer's
  /// step counts onto the device.
  void afterEagerStep();
  /// The per-layer expert-load counters the graph writes (Model::lastLoad as
  /// the capture left it), for Model::setLoadTensors after other forwards.
  const std::vector<torch::Tensor> &loadTensors() const;

private:
  struct State;
  explicit StepGraph(std::unique_ptr<State> state);
  std::unique_ptr<State> state;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_STEPGRAPH_H
