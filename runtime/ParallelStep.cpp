//===- ParallelStep.cpp - what a training step adds in a parallel run -----===//

#include "runtime/ParallelStep.h"

#include <algorithm>
#include <cmath>

namespace adapt::rt {

namespace {

int64_t epSize(const Distributed *run) { return run ? run->layout().ep : 1; }
int64_t tpSize(const Distributed *run) { return run ? run->layout().tp : 1; }

bool tensorSplit(const AdapterTensor &a) {
  return a.shard == AdapterShard::TensorRows || a.shard == AdapterShard::TensorColumns;
}
bool expertSplit(const AdapterTensor &a) {
  return a.shard == AdapterShard::ExpertRows || a.shard == AdapterShard::ExpertColumns;
}

} // namespace

std::pair<int64_t, int64_t> batchSlice(const Distributed &run, int64_t globalBatch) {
  const int64_t per = globalBatch / run.layout().dataRanks();
  return {run.dataRank() * per, per};
}

void reduceGradients(const std::vector<AdapterTensor> &params, Distributed &run) {
  std::vector<torch::Tensor> dense, experts, partial;
  for (const AdapterTensor &p : params) {
    torch::Tensor grad = p.value.mutable_grad();
    if (!grad.defined()) // Untouched this step (no token reached it): zero.
      grad = p.value.mutable_grad() = torch::zeros_like(p.value);
    if (p.tensorPartial)
      partial.push_back(grad);
    (expertSplit(p) ? experts : dense).push_back(grad);
  }
  if (run.layout().tp > 1) // Each TP rank holds its part of these first.
    run.tensor().allReduceSum(partial);
  run.data().allReduceSum(dense);
  run.expertData().allReduceSum(experts);
}

double globalGradNorm(const std::vector<AdapterTensor> &params, Distributed &run) {
  double whole = 0.0;
  torch::Tensor experts = torch::zeros({1}, torch::kFloat64);
  torch::Tensor tensorShards = torch::zeros({1}, torch::kFloat64);
  for (const AdapterTensor &p : params) {
    double squares = p.value.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    if (expertSplit(p))
      experts += squares;
    else if (tensorSplit(p))
      tensorShards += squares;
    else
      whole += squares;
  }
  std::vector<torch::Tensor> expertSum = {experts}, tensorSum = {tensorShards};
  run.expert().allReduceSum(expertSum);
  run.tensor().allReduceSum(tensorSum);
  std::vector<torch::Tensor> stage = {
      torch::tensor({whole + expertSum[0].item<double>() + tensorSum[0].item<double>()}, torch::kFloat64)};
  if (run.layout().pp > 1) // Each stage's squares once.
    run.pipeline().allReduceSum(stage);
  return std::sqrt(stage[0].item<double>());
}

std::vector<bool> optimizerOwners(const std::vector<AdapterTensor> &trained, Distributed *run) {
  std::vector<bool> owned(trained.size(), true);
  if (!run)
    return owned;
  for (bool experts : {false, true}) {
    Collectives &group = experts ? run->expertData() : run->data();
    std::vector<size_t> order;
    for (size_t i = 0; i < trained.size(); ++i)
      if (expertSplit(trained[i]) == experts)
        order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return trained[a].value.numel() > trained[b].value.numel(); });
    std::vector<int64_t> load(static_cast<size_t>(group.size()), 0);
    for (size_t i : order) {
      const size_t member = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[member] += trained[i].value.numel();
      owned[i] = static_cast<int>(member) == group.rank();
    }
  }
  return owned;
}

void shareFromOwners(const std::vector<AdapterTensor> &trained, const std::vector<bool> &owned,
                     std::vector<torch::Tensor> &values, Distributed *run) {
  if (!run)
    return;
  torch::NoGradGuard noGrad;
  std::vector<torch::Tensor> dense, experts;
  for (size_t i = 0; i < trained.size(); ++i) {
    if (!owned[i])
      values[i].zero_();
    (expertSplit(trained[i]) ? experts : dense).push_back(values[i]);
  }
  run->data().allReduceSum(dense);
  run->expertData().allReduceSum(experts);
}

void assembleStages(const std::vector<AdapterTensor> &params, std::vector<torch::Tensor> &wholes,
                    Distributed *run) {
  if (!run || run->layout().pp == 1)
    return;
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].local)
      wholes[i] = torch::zeros_like(wholes[i]);
  run->pipeline().allReduceSum(wholes);
}

torch::Tensor gatherShard(const AdapterTensor &adapter, const torch::Tensor &local, Distributed *run) {
  if (adapter.shard == AdapterShard::TensorRows || adapter.shard == AdapterShard::TensorColumns) {
    if (tpSize(run) == 1)
      return local;
    return torch::cat(run->tensor().allGather(local.contiguous()),
                      adapter.shard == AdapterShard::TensorRows ? 0 : 1);
  }
  if (!expertSplit(adapter) || epSize(run) == 1)
    return local;
  std::vector<torch::Tensor> parts = run->expert().allGather(local.contiguous());
  if (adapter.shard == AdapterShard::ExpertRows)
    return torch::cat(parts, 0);
  // [out, r*E_local] with column k*E_local+e: join along the expert axis.
  const int64_t r = adapter.rank;
  for (torch::Tensor &part : parts)
    part = part.view({part.size(0), r, -1});
  torch::Tensor whole = torch::cat(parts, 2);
  return whole.reshape({whole.size(0), -1});
}

torch::Tensor shardOf(const AdapterTensor &adapter, const torch::Tensor &whole, const Distributed *run) {
  if (tensorSplit(adapter)) {
    const int64_t tp = tpSize(run);
    if (tp == 1)
      return whole;
    const int dim = adapter.shard == AdapterShard::TensorRows ? 0 : 1;
    const int64_t size = whole.size(dim) / tp;
    return whole.narrow(dim, run->tensorRank() * size, size).contiguous();
  }
  const int64_t ep = epSize(run);
  if (!expertSplit(adapter) || ep == 1)
    return whole;
  const int64_t index = run->expertRank();
  if (adapter.shard == AdapterShard::ExpertRows) {
    const int64_t rows = whole.size(0) / ep;
    return whole.narrow(0, index * rows, rows).contiguous();
  }
  const int64_t r = adapter.rank;
  torch::Tensor view = whole.view({whole.size(0), r, -1});
  const int64_t local = view.size(2) / ep;
  return view.narrow(2, index * local, local).reshape({whole.size(0), -1}).contiguous();
}

std::vector<int64_t> wholeShape(const AdapterTensor &adapter, const Distributed *run) {
  std::vector<int64_t> shape = adapter.value.sizes().vec();
  if (expertSplit(adapter))
    shape[adapter.shard == AdapterShard::ExpertRows ? 0 : 1] *= epSize(run);
  else if (tensorSplit(adapter))
    shape[adapter.shard == AdapterShard::TensorRows ? 0 : 1] *= tpSize(run);
  return shape;
}

} // namespace adapt::rt
