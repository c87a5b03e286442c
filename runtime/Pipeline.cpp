//===- Pipeline.cpp - a pipeline-parallel training step (1F1B) ------------===//

#include "runtime/Pipeline.h"

#include <chrono>
#include <map>

namespace adapt::rt {

std::vector<int64_t> oneForwardOneBackward(int64_t stage, int64_t stages, int64_t micro) {
  const int64_t warmup = std::min(stages - stage - 1, micro);
  std::vector<int64_t> order;
  int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward)
    order.push_back(forward + 1);
  while (forward < micro) {
    order.push_back(++forward);
    order.push_back(-(++backward));
  }
  while (backward < micro)
    order.push_back(-(++backward));
  return order;
}

double pipelineStep(Model &model, const torch::Tensor &ids, const torch::Tensor &labels, int64_t micro,
                    double globalCount, Distributed &run, PipelineTimes &times) {
  Collectives &pipe = run.pipeline();
  const int stage = pipe.rank(), stages = pipe.size();
  const bool first = stage == 0, last = stage + 1 == stages;
  const int64_t rows = ids.size(0) / micro, seqLen = ids.size(1);
  const std::vector<int64_t> activation = {rows, seqLen, model.def().hidden};
  const torch::TensorOptions options =
      torch::TensorOptions().dtype(model.modelOptions().dtype).device(model.modelOptions().device);
  // Tags: 2m for micro-batch m's activation, 2m + 1 for its gradient.
  struct InFlight {
    torch::Tensor input, output; ///< Stage input (a leaf on later stages) and output or loss share.
  };
  std::map<int64_t, InFlight> alive;
  auto receive = [&](int peer, int tag) {
    auto start = std::chrono::steady_clock::now();
    torch::Tensor t = pipe.recv(activation, options, peer, tag);
    times.waitSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return t;
  };
  double local = 0.0;
  for (int64_t step : oneForwardOneBackward(stage, stages, micro)) {
    const int64_t m = (step > 0 ? step : -step) - 1;
    const int tag = static_cast<int>(2 * m);
    if (step > 0) {
      InFlight f;
      f.input = first ? ids.narrow(0, m * rows, rows) : receive(stage - 1, tag).requires_grad_(true);
      torch::Tensor out = model.stageForward(f.input);
      if (last) {
        f.output = model.lossSumOfHidden(out, labels.narrow(0, m * rows, rows)) / globalCount;
      } else {
        pipe.send(out, stage + 1, tag);
        f.output = out;
      }
      alive[m] = std::move(f);
      continue;
    }
    InFlight f = std::move(alive.at(m));
    alive.erase(m);
    if (last) {
      local += f.output.item<double>();
      f.output.backward(); // A non-finite share still runs, so every stage keeps the schedule.
    } else {
      torch::Tensor grad = receive(stage + 1, tag + 1);
      if (f.output.requires_grad())
        f.output.backward(grad);
    }
    if (!first) {
      torch::Tensor g = f.input.grad();
      pipe.send(g.defined() ? g : torch::zeros_like(f.input), stage - 1, tag + 1);
    }
  }
  pipe.waitSends();
  return local;
}

} // namespace adapt::rt
