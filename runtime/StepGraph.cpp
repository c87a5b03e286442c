//===- StepGraph.cpp - a training step replayed as one CUDA graph ---------===//

#include "runtime/StepGraph.h"
#include "runtime/Model.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#ifdef ADAPT_WITH_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace adapt::rt {

namespace {

/// One fused AdamW call's tensors: the kernel wants one dtype per call.
struct AdamGroup {
  std::vector<torch::Tensor> params, grads, averages, squares, steps;
};

} // namespace

struct StepGraph::State {
#ifdef ADAPT_WITH_CUDA_GRAPHS
  at::cuda::CUDAGraph graph;
#endif
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;            ///< Per param: the graph's gradient (or undefined).
  std::vector<torch::Tensor> steps;            ///< Per param: the device step count.
  std::vector<torch::optim::AdamWParamState *> states; ///< Per param (host step counts).
  torch::Tensor ids, labels, lr;
  torch::Tensor report; ///< [loss, gradient norm] in float64, written by the graph.
  std::vector<torch::Tensor> load;
};

StepGraph::StepGraph(std::unique_ptr<State> s) : state(std::move(s)) {}
StepGraph::~StepGraph() = default;

bool StepGraph::available() {
#ifdef ADAPT_WITH_CUDA_GRAPHS
  return true;
#else
  return false;
#endif
}

bool StepGraph::fits(const Batch &batch) const {
  return !batch.pixels.defined() && batch.ids.sizes() == state->ids.sizes() &&
         batch.labels.sizes() == state->labels.sizes();
}

const std::vector<torch::Tensor> &StepGraph::loadTensors() const { return state->load; }

#ifdef ADAPT_WITH_CUDA_GRAPHS

namespace {

/// AdamW's state for \p param, made as torch::optim::AdamW makes it when a
/// parameter has no state yet (it got no gradient in the eager steps).
torch::optim::AdamWParamState &adamState(torch::optim::AdamW &optimizer, const torch::Tensor &param) {
  auto &all = optimizer.state();
  auto it = all.find(param.unsafeGetTensorImpl());
  if (it == all.end()) {
    auto made = std::make_unique<torch::optim::AdamWParamState>();
    made->step(0);
    made->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    made->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
    it = all.emplace(param.unsafeGetTensorImpl(), std::move(made)).first;
  }
  return static_cast<torch::optim::AdamWParamState &>(*it->second);
}

} // namespace

std::unique_ptr<StepGraph> StepGraph::capture(Model &model, torch::optim::AdamW &optimizer,
                                              std::vector<torch::Tensor> params, const Batch &batch,
                                              double lr, double maxNorm, Result &first, std::string &why) {
  if (batch.pixels.defined()) {
    why = "batches with images change shape";
    return nullptr;
  }
  const torch::Device device = params.at(0).device();
  const auto &options = static_cast<const torch::optim::AdamWOptions &>(optimizer.param_groups().at(0).options());
  const auto [beta1, beta2] = options.betas();
  auto s = std::make_unique<State>();
  s->params = params;
  for (torch::Tensor &p : params)
    p.mutable_grad() = torch::Tensor();
  for (const torch::Tensor &p : params) {
    torch::optim::AdamWParamState &st = adamState(optimizer, p);
    s->states.push_back(&st);
    s->steps.push_back(torch::full({}, static_cast<double>(st.step()), torch::dtype(torch::kFloat32).device(device)));
  }
  s->ids = batch.ids.to(device);
  s->labels = batch.labels.to(device);
  s->lr = torch::full({}, lr, torch::dtype(torch::kFloat32).device(device));
  torch::cuda::synchronize();
  // The eager steps' cached activations go back, so that the graph's pool
  // does not stand beside them.
  c10::cuda::CUDACachingAllocator::emptyCache();
  model.sumExpertLoad();

  // Captured on a side stream, which must still be current when the
  // capture ends (also after a failure).
  std::optional<c10::cuda::CUDAStreamGuard> onStream(std::in_place,
                                                     c10::cuda::getStreamFromPool(false, device.index()));
  bool capturing = false;
  try {
    s->graph.capture_begin();
    capturing = true;
    torch::Tensor loss = model.loss(s->ids, s->labels);
    loss.backward();
    std::map<torch::ScalarType, AdamGroup> groups;
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor g = params[i].grad();
      s->grads.push_back(g);
      if (!g.defined())
        continue;
      grads.push_back(g);
      AdamGroup &group = groups[params[i].scalar_type()];
      group.params.push_back(params[i]);
      group.grads.push_back(g);
      group.averages.push_back(s->states[i]->exp_avg());
      group.squares.push_back(s->states[i]->exp_avg_sq());
      group.steps.push_back(s->steps[i]);
    }
    torch::Tensor norm = grads.empty() ? torch::zeros({}, torch::dtype(torch::kFloat32).device(device))
                                       : torch::stack(at::_foreach_norm(grads, 2, torch::kFloat32)).norm();
    if (std::isfinite(maxNorm) && !grads.empty()) // clip_grad_norm_'s rule
      at::_foreach_mul_(grads, (maxNorm / (norm + 1e-6)).clamp_max(1.0));
    torch::Tensor lossValue = loss.detach().to(torch::kFloat32);
    torch::Tensor skip = torch::logical_not(torch::isfinite(lossValue) & torch::isfinite(norm)).to(torch::kFloat32);
    for (auto &[dtype, group] : groups) {
      at::_foreach_add_(group.steps, 1);
      at::_fused_adamw_(group.params, group.grads, group.averages, group.squares, {}, group.steps, s->lr, beta1,
                        beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false, /*maximize=*/false,
                        std::nullopt, skip);
    }
    s->report = torch::stack({loss.detach().to(torch::kFloat64), norm.to(torch::kFloat64)});
    capturing = false;
    s->graph.capture_end();
  } catch (const std::exception &e) {
    why = e.what();
    if (capturing) {
      try {
        s->graph.capture_end();
      } catch (const std::exception &) { // An invalidated capture: ending it reports that again.
      }
    }
    (void)cudaGetLastError(); // The capture's error is not sticky; clear it.
    onStream.reset();
    s.reset();
    for (torch::Tensor &p : params)
      p.mutable_grad() = torch::Tensor();
    model.sumExpertLoad();
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    return nullptr;
  }
  onStream.reset();
  s->load = model.loadTensors();
  std::unique_ptr<StepGraph> graph(new StepGraph(std::move(s)));
  first = graph->run(batch, lr);
  return graph;
}

StepGraph::Result StepGraph::run(const Batch &batch, double lr) {
  State &s = *state;
  s.ids.copy_(batch.ids);
  s.labels.copy_(batch.labels);
  s.lr.fill_(lr);
  s.graph.replay();
  torch::Tensor report = s.report.cpu(); // waits for the step
  Result r{report[0].item<double>(), report[1].item<double>()};
  if (std::isfinite(r.loss) && std::isfinite(r.gradNorm)) // else the graph skipped the update
    for (size_t i = 0; i < s.states.size(); ++i)
      if (s.grads[i].defined())
        s.states[i]->step(s.states[i]->step() + 1);
  return r;
}

void StepGraph::afterEagerStep() {
  State &s = *state;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i].mutable_grad() = s.grads[i];
    s.steps[i].fill_(static_cast<double>(s.states[i]->step()));
  }
}

#else // A CPU-only LibTorch: nothing to capture.

std::unique_ptr<StepGraph> StepGraph::capture(Model &, torch::optim::AdamW &, std::vector<torch::Tensor>,
                                              const Batch &, double, double, Result &, std::string &why) {
  why = "this runtime was built without CUDA";
  return nullptr;
}

StepGraph::Result StepGraph::run(const Batch &, double) { return {}; }
void StepGraph::afterEagerStep() {}

#endif

} // namespace adapt::rt
