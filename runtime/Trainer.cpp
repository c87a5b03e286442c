//===- Trainer.cpp - LoRA training loop and export ------------------------===//
//
// The step (eager, or replayed as a CUDA graph: StepGraph.h), evaluation,
// metrics, signals and the adapter export. Checkpoints are in
// TrainerCheckpoint.cpp.
//
//===----------------------------------------------------------------------===//
#include "runtime/Trainer.h"
#include "runtime/ExpertParallel.h"
#include "runtime/ParallelStep.h"
#include "runtime/Pipeline.h"
#include "runtime/Profiler.h"
#include "runtime/KernelLedger.h"
#include "runtime/RunReport.h"
#include "runtime/TensorParallel.h"
#include "runtime/FileSystem.h"
#include "runtime/SafetensorsIO.h"
#include "runtime/StepGraph.h"

#include <ATen/record_function.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <map>
#include <unordered_set>

#include <fcntl.h>
#include <unistd.h>

namespace adapt::rt {

namespace {

volatile std::sig_atomic_t gStopSignal = 0;

void onStopSignal(int signal) { gStopSignal = signal; }




/// The per-step seed of the global generators (dropout): a splitmix64 mix
/// of the run seed and the step index, so runs with nearby seeds differ.
uint64_t stepSeed(uint64_t seed, int64_t index) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) & 0x7fffffffffffffffull;
}

const char *signalName(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal";
}

std::string durationText(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(s / 3600),
                  (long long)(s / 60 % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  return buf;
}



} // namespace

double learningRate(const TrainOptions &o, int64_t index) {
  if (o.warmup > 0 && index < o.warmup)
    return o.lr * static_cast<double>(index + 1) / static_cast<double>(o.warmup);
  int64_t decaySteps = o.steps - o.warmup;
  if (decaySteps <= 0)
    return o.lr;
  double progress = static_cast<double>(index - o.warmup) / static_cast<double>(decaySteps);
  progress = std::clamp(progress, 0.0, 1.0);
  if (o.schedule == "constant")
    return o.lr;
  if (o.schedule == "linear")
    return o.lr * (1.0 - progress);
  constexpr double kPi = 3.14159265358979323846;
  return o.lr * 0.5 * (1.0 + std::cos(kPi * progress));
}

void installStopSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND; // A second signal takes the default action.
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int stopRequested() { return gStopSignal; }


//===----------------------------------------------------------------------===//
// Trainer
//===----------------------------------------------------------------------===//

Trainer::Trainer(Model &model, const TrainOptions &options)
    : model(model), opts(options), params(model.adapters()) {
  for (const AdapterTensor &a : params)
    if (a.local)
      trained.push_back(a);
  owned = optimizerOwners(trained, opts.distributed.get());
  std::vector<torch::Tensor> tensors;
  for (size_t i = 0; i < trained.size(); ++i)
    if (owned[i])
      tensors.push_back(trained[i].value);
  if (!tensors.empty())
    optimizer = std::make_unique<torch::optim::AdamW>(
        tensors, torch::optim::AdamWOptions(opts.lr)
                     .betas(std::make_tuple(0.9, 0.999))
                     .eps(1e-8)
                     .weight_decay(opts.weightDecay));
  if (!opts.forceRoutingPath.empty())
    forcedRouting = std::make_unique<SafetensorsFile>(opts.forceRoutingPath);
}

double Trainer::lossAndGradients(const Batch &batch, double &allReduceSeconds) {
  const int64_t micro = opts.microBatches;
  if (!opts.distributed && micro == 1) {
    torch::Tensor ids = batch.ids.to(opts.device), labels = batch.labels.to(opts.device);
    torch::Tensor loss = model.loss(ids, labels, ImageInput{batch.pixels, batch.gridThw});
    // Backward is queued before the loss is read: reading it first would
    // leave the GPU idle while the host launches backward. A non-finite loss
    // stops the run before the optimizer (train()), so its gradients are unused.
    loss.backward();
    return loss.item<double>();
  }
  if (batch.pixels.defined())
    throw badInput(opts.dataPath, "images",
                   "expected text-only documents: image documents with micro-batches or in a "
                   "parallel run are not implemented yet");
  Distributed *run = opts.distributed.get();
  auto [first, count] = run ? batchSlice(*run, batch.ids.size(0))
                            : std::pair<int64_t, int64_t>{0, batch.ids.size(0)};
  torch::Tensor ids = batch.ids.narrow(0, first, count).to(opts.device);
  torch::Tensor labels = batch.labels.narrow(0, first, count).to(opts.device);
  if (run && run->layout().cp > 1) {
    // Context parallelism: this rank's part of every sequence, and its
    // labels with the next part's first one (its last token's target).
    const int64_t part = ids.size(1) / run->layout().cp, start = run->contextRank() * part;
    ids = ids.narrow(1, start, part);
    labels = labels.narrow(1, start, std::min(part + 1, labels.size(1) - start));
  }
  // The single-process loss is the mean over every target token of the
  // global batch: each micro-batch's share is its sum over the global
  // count, so the shares' gradients, summed here and over the ranks, are
  // the whole batch's.
  std::vector<torch::Tensor> targets = { // Positions that predict a token (each counted on one rank).
      (labels.narrow(1, 1, labels.size(1) - 1) != -100).sum().to(torch::kCPU, torch::kFloat64)};
  if (run)
    run->data().allReduceSum(targets);
  const double globalCount = std::max(targets[0].item<double>(), 1.0);
  const int64_t rows = count / micro;
  double local = 0.0;
  if (run && run->layout().pp > 1) {
    PipelineTimes times;
    local = pipelineStep(model, ids, labels, micro, globalCount, *run, times);
    pipelineWaitSeconds = times.waitSeconds;
  } else {
    for (int64_t m = 0; m < micro; ++m) {
      torch::Tensor share =
          model.lossSumOfHidden(model.stageForward(ids.narrow(0, m * rows, rows)), labels.narrow(0, m * rows, rows)) /
          globalCount;
      share.backward(); // queued before the value is read, as above
      const double value = share.item<double>();
      // Alone, stop at once; in a parallel run every rank keeps to the
      // collectives and all see the non-finite total below.
      if (!std::isfinite(value) && !run)
        return value;
      local += value;
    }
  }
  if (!run)
    return local;
  if (run->layout().cp > 1) // The neighbours' sends of the step's state exchanges.
    run->context().waitSends();
  std::vector<torch::Tensor> total = {torch::tensor({local}, torch::kFloat64)};
  run->data().allReduceSum(total);
  if (run->layout().pp > 1) // Only the last stage holds losses.
    run->pipeline().allReduceSum(total);
  auto start = std::chrono::steady_clock::now();
  reduceGradients(trained, *run);
  allReduceSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return total[0].item<double>();
}

void Trainer::forceRoutingOf(int64_t index) {
  const std::string prefix = std::to_string(index) + ".";
  std::map<std::string, torch::Tensor> experts;
  for (const TensorInfo &t : forcedRouting->tensors())
    if (t.name.rfind(prefix, 0) == 0)
      experts[t.name.substr(prefix.size())] = forcedRouting->view(t.name).to(opts.device, torch::kLong);
  if (opts.distributed) { // This data rank's sequences: rows [first*T, (first+count)*T).
    auto [first, count] = batchSlice(*opts.distributed, opts.batch);
    for (auto &[block, chosen] : experts) // experts [tokens, k]; an indexer's keys [B, T, k]
      chosen = chosen.dim() == 3 ? chosen.narrow(0, first, count)
                                 : chosen.narrow(0, first * opts.seqLen, count * opts.seqLen);
  }
  if (experts.empty())
    throw badInput(opts.forceRoutingPath, prefix + "*",
                   "expected the forced experts of step " + std::to_string(index) + " (0-based)");
  model.forceRouting(std::move(experts));
}

Trainer::~Trainer() {
  if (metricsFd >= 0)
    ::close(metricsFd);
}


void Trainer::reportKernels(bool final) const {
  if (!opts.device.is_cuda() || !writes())
    return;
  const std::vector<KernelTally> tallies = kernelTallies();
  writeFileAtomic(joinPath(opts.outDir, "kernels.json"), kernelLedgerJson(tallies)); // report.html shows it
  if (final)
    return;
  if (!cudaKernelsBuiltIn()) {
    std::fprintf(stderr, "CUDA kernels: not built into this runtime (nvcc was missing); every op runs as LibTorch "
                         "composition\n");
    return;
  }
  std::fprintf(stderr, "CUDA kernels in step %lld: %s\n", (long long)completed, kernelLedgerLine(tallies).c_str());
  int64_t refused = 0;
  for (const KernelTally &t : tallies)
    refused += t.refused;
  if (refused > 0)
    std::fprintf(stderr,
                 "warning: %lld calls ran the LibTorch composition because their kernel does not take their shapes, "
                 "dtypes or layouts (OUT/kernels.json; docs/runtime.md lists what each kernel takes)\n",
                 (long long)refused);
}

void Trainer::writeReport() const {
  if (!writes())
    return;
  try {
    writeRunReport(opts.outDir);
  } catch (const RuntimeError &e) { // The curves can wait; the run goes on.
    std::fprintf(stderr, "warning: report.html not written: %s\n", e.what());
  }
}

void Trainer::truncateMetrics() {
  std::string path = joinPath(opts.outDir, "metrics.jsonl");
  std::string kept;
  std::ifstream in(path, std::ios::binary);
  if (in && completed > 0) {
    std::string line;
    while (std::getline(in, line)) {
      try {
        JsonValue v = parseJson(line, path);
        const JsonValue *step = v.find("step");
        if (!step || !step->isInt() || step->asInt() > completed)
          break;
      } catch (const RuntimeError &) {
        break; // A line cut by a crash ends the usable part.
      }
      kept += line + "\n";
    }
  }
  in.close();
  writeFileAtomic(path, kept);
}

void Trainer::appendMetrics(const std::string &line) {
  std::string path = joinPath(opts.outDir, "metrics.jsonl");
  if (metricsFd < 0) {
    metricsFd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (metricsFd < 0)
      throw writeError(path, "open", errno);
  }
  if (!writeAll(metricsFd, line + "\n"))
    throw writeError(path, "write", errno);
  if (::fsync(metricsFd) != 0)
    throw writeError(path, "fsync", errno);
}

int Trainer::interrupted(int signal) {
  if (completed > 0 && checkpointStep != completed)
    saveCheckpoint();
  std::string ck = checkpointDir(opts.outDir);
  if (checkpointStep >= 0)
    std::fprintf(stderr,
                 "\ninterrupted by %s after step %lld: checkpoint of step %lld is in %s; "
                 "run again with --resume to continue\n",
                 signalName(signal), (long long)completed, (long long)checkpointStep, ck.c_str());
  else
    std::fprintf(stderr, "\ninterrupted by %s before the first step; nothing to checkpoint\n",
                 signalName(signal));
  return kExitInterrupted;
}

int Trainer::run(const PackedDataset &data) { return run(data, nullptr); }

double Trainer::evalLoss(const PackedDataset &eval) {
  torch::NoGradGuard noGrad;
  const int64_t all = std::max<int64_t>(1, eval.windows() / opts.batch);
  const int64_t batches = opts.evalBatches > 0 ? std::min(opts.evalBatches, all) : all;
  double sum = 0.0, count = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = eval.batch(i, opts.batch);
    torch::Tensor ids = b.ids.to(opts.device), labels = b.labels.to(opts.device);
    const double targets = (labels.narrow(1, 1, labels.size(1) - 1) != -100).sum().item<double>();
    if (targets == 0)
      continue;
    sum += model.evalLossSum(ids, labels, ImageInput{b.pixels, b.gridThw}).item<double>();
    count += targets;
  }
  return count > 0 ? sum / count : std::nan("");
}

void Trainer::saveBestAdapter(double loss) {
  const std::string dir = joinPath(opts.outDir, "best-adapter"), tmp = dir + ".tmp", old = dir + ".old";
  removeAll(tmp);
  exportAdapter(model, opts.modelDir, tmp);
  JsonValue note = JsonValue::object({{"step", completed}, {"eval_loss", loss}, {"eval_data", opts.evalDataPath}});
  writeFileAtomic(joinPath(tmp, "adapt_eval.json"), note.dump(2) + "\n");
  removeAll(old);
  if (pathExists(dir))
    renamePath(dir, old);
  renamePath(tmp, dir);
  removeAll(old);
  bestEvalLoss = loss;
}

StepGraph::Result Trainer::eagerStep(const Batch &b, int64_t index, double &allReduceSeconds) {
  for (const AdapterTensor &p : trained) // Owned or not: every replica reduces them.
    p.value.mutable_grad() = torch::Tensor();
  model.sumExpertLoad();
  StepGraph::Result result;
  result.loss = lossAndGradients(b, allReduceSeconds);
  if (!std::isfinite(result.loss))
    throw notFinite("loss", result.loss, index);
  if (!opts.gradientsPath.empty()) {
    std::vector<torch::Tensor> wholes;
    for (const AdapterTensor &p : params) {
      torch::Tensor grad = p.value.grad().defined() ? p.value.grad() : torch::zeros_like(p.value);
      wholes.push_back(gatherShard(p, grad.detach(), opts.distributed.get()).to(torch::kCPU).clone());
    }
    assembleStages(params, wholes, opts.distributed.get());
    for (size_t i = 0; i < params.size(); ++i)
      gradients.emplace_back(std::to_string(index + 1) + "." + params[i].peftKey, wholes[i]);
  }
  std::vector<torch::Tensor> tensors;
  for (const AdapterTensor &a : trained)
    tensors.push_back(a.value);
  if (!opts.distributed) {
    result.gradNorm = torch::nn::utils::clip_grad_norm_(tensors, maxNorm());
  } else {
    // clip_grad_norm_'s rule, over the whole model's gradients.
    result.gradNorm = globalGradNorm(trained, *opts.distributed);
    const double coefficient = maxNorm() / (result.gradNorm + 1e-6);
    if (coefficient < 1.0) {
      torch::NoGradGuard noGrad;
      for (torch::Tensor &t : tensors)
        t.mutable_grad().mul_(coefficient);
    }
  }
  if (!std::isfinite(result.gradNorm))
    throw notFinite("gradient norm", result.gradNorm, index);
  if (optimizer) {
    RECORD_FUNCTION("adapt::optimizer", c10::ArrayRef<const c10::IValue>{});
    optimizer->step();
  }
  if (opts.distributed) { // ZeRO-1: every replica takes the owners' new values.
    std::vector<torch::Tensor> values;
    for (const AdapterTensor &p : trained)
      values.push_back(p.value);
    shareFromOwners(trained, owned, values, opts.distributed.get());
  }
  if (graph) // A batch the graph did not fit ran eagerly.
    graph->afterEagerStep();
  return result;
}

bool Trainer::graphStep(const Batch &b, double lr, StepGraph::Result &result) {
  if (!graph && !graphTried) {
    graphTried = true;
    std::vector<torch::Tensor> tensors;
    for (const AdapterTensor &a : trained)
      tensors.push_back(a.value);
    std::string why;
    graph = StepGraph::capture(model, *optimizer, tensors, b, lr, maxNorm(), result, why);
    if (!graph) {
      const char *trace = std::getenv("TORCH_SHOW_CPP_STACKTRACES"); // LibTorch's switch for the whole text
      std::fprintf(stderr, "CUDA graph: not used (%s); every step runs eagerly\n",
                   (trace && std::string(trace) == "1" ? why : why.substr(0, why.find('\n'))).c_str());
      return false;
    }
    std::fprintf(stderr, "CUDA graph: step %lld captured; later steps replay it (--no-cuda-graphs: eager)\n",
                 (long long)(completed + 1));
  } else if (!graph || !graph->fits(b)) {
    return false;
  } else {
    result = graph->run(b, lr);
  }
  model.setLoadTensors(graph->loadTensors()); // An eval forward may have replaced them.
  return true;
}

RuntimeError Trainer::notFinite(const char *what, double value, int64_t index) const {
  return RuntimeError("", "",
                      std::string(what) + " is " + (std::isnan(value) ? "NaN" : value > 0 ? "Inf" : "-Inf") +
                          " at step " + std::to_string(index + 1) + "; " + checkpointNote(),
                      kExitDiverged);
}

int Trainer::run(const PackedDataset &data, const PackedDataset *eval) {
  if (params.empty())
    throw badInput(opts.modelDir, "lora targets",
                   "expected at least one adapter tensor to train, but the "
                   "LoRA targets matched no module");
  currentFingerprint = data.fingerprint();
  if (!restoredFingerprint.empty() && restoredFingerprint != currentFingerprint)
    std::fprintf(stderr,
                 "warning: the data or packing differs from the checkpoint's (%s, now %s); "
                 "the resumed run will not repeat the batches of an uninterrupted one\n",
                 restoredFingerprint.c_str(), currentFingerprint.c_str());
  if (writes()) {
    truncateMetrics();
    tensorBoard = std::make_unique<TensorBoardWriter>(joinPath(opts.outDir, "tensorboard"));
    // A resumed run's best adapter so far, to be beaten.
    std::ifstream noteFile(joinPath(joinPath(opts.outDir, "best-adapter"), "adapt_eval.json"));
    std::string noteText((std::istreambuf_iterator<char>(noteFile)), std::istreambuf_iterator<char>());
    try {
      if (eval && !noteText.empty())
        if (const JsonValue *v = parseJson(noteText, "best-adapter/adapt_eval.json").find("eval_loss"); v && v->isNumber())
          bestEvalLoss = v->asDouble();
    } catch (const RuntimeError &) { // An unreadable note: the next eval replaces the adapter.
    }
  }

  const bool tty = ::isatty(STDERR_FILENO);
  const bool cuda = opts.device.is_cuda();
  double peak = opts.peakFlops > 0 ? opts.peakFlops
                : (cuda && opts.dtype == torch::kBFloat16) ? 989e12
                                                           : 0.0;
  const double flopsPerToken = model.flopsPerToken(opts.seqLen);
  const double tokensPerStep = static_cast<double>(opts.batch * opts.seqLen);
  const int64_t firstStep = completed;
  using Clock = std::chrono::steady_clock;
  const auto runStart = Clock::now();
  // --profile N: from the second step, so one-time allocation stays out.
  const int64_t profileFirst = opts.steps - firstStep > opts.profileSteps ? firstStep + 1 : firstStep;
  StepProfiler profiler(opts.outDir, profileFirst,
                        writes() ? std::min(opts.profileSteps, opts.steps - profileFirst) : 0, cuda,
                        model.def().lora.rank, model.def().vocab);
  // CUDA graphs: from the third step of this run and after the profiled steps
  // (runtime/StepGraph.h); the eager steps before warm up caches and state.
  graphFrom = std::numeric_limits<int64_t>::max();
  if (opts.cudaGraphs && cuda && StepGraph::available() && optimizer && !opts.distributed &&
      opts.microBatches == 1 && opts.gradientsPath.empty() && model.def().lora.dropout == 0.0)
    graphFrom = std::max(firstStep + 2, opts.profileSteps > 0 ? profileFirst + opts.profileSteps : 0);

  // The untrained adapter's eval loss (a fresh run only): what training has to beat.
  double untrainedEval = std::nan("");
  if (eval && completed == 0 && opts.steps > 0) {
    untrainedEval = evalLoss(*eval);
    if (writes()) {
      std::fprintf(stderr, "eval loss before training: %.4f\n", untrainedEval);
      if (std::isfinite(untrainedEval))
        tensorBoard->addScalars(0, {{"eval/loss", untrainedEval}});
    }
  }

  while (completed < opts.steps) {
    if (int signal = stopRequested())
      return interrupted(signal);
    const int64_t index = completed;
    profiler.beforeStep(index);
    const auto stepStart = Clock::now();
    const double lr = learningRate(opts, index);
    if (optimizer) // A rank may own no tensor (ZeRO-1) or train none (a pipeline stage).
      for (auto &group : optimizer->param_groups())
        static_cast<torch::optim::AdamWOptions &>(group.options()).lr(lr);
    torch::manual_seed(stepSeed(opts.seed, index));

    Batch b = data.batch(index, opts.batch);
    if (forcedRouting) // into the tensors a captured step reads
      forceRoutingOf(index);
    double allReduceSeconds = 0.0;
    StepGraph::Result result;
    const bool replayed = index >= graphFrom && graphStep(b, lr, result);
    if (replayed) { // The graph skipped the update of a non-finite step.
      if (!std::isfinite(result.loss))
        throw notFinite("loss", result.loss, index);
      if (!std::isfinite(result.gradNorm))
        throw notFinite("gradient norm", result.gradNorm, index);
    } else {
      result = eagerStep(b, index, allReduceSeconds);
    }
    const double lossValue = result.loss, gradNorm = result.gradNorm;
    if (cuda)
      torch::cuda::synchronize();
    completed = index + 1;
    if (index == firstStep)
      reportKernels(/*final=*/false);
    lastLoss = lossValue;
    lastLr = lr;

    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - stepStart).count();
    const double tokensPerSecond = tokensPerStep / std::max(seconds, 1e-9);
    ExpertLoad expertLoad = model.expertLoad();
    if (opts.distributed) { // Tokens from every data rank: every layer in one all-reduce.
      const bool pipelined = opts.distributed->layout().pp > 1;
      if (pipelined) // Another stage's MoE layers: zeros here, its counts after the sum.
        for (size_t i = 0; i < expertLoad.size(); ++i)
          if (expertLoad[i].empty())
            expertLoad[i].assign(static_cast<size_t>(model.def().layers[i].ffn.experts), 0);
      std::vector<torch::Tensor> counts;
      for (const std::vector<int64_t> &layer : expertLoad)
        counts.push_back(torch::tensor(layer, torch::kLong));
      opts.distributed->data().allReduceSum(counts);
      if (pipelined)
        opts.distributed->pipeline().allReduceSum(counts);
      for (size_t i = 0; i < expertLoad.size(); ++i)
        expertLoad[i].assign(counts[i].data_ptr<int64_t>(), counts[i].data_ptr<int64_t>() + expertLoad[i].size());
    }
    JsonValue load = JsonValue::array();
    for (const std::vector<int64_t> &layer : expertLoad) {
      JsonValue counts = JsonValue::array();
      for (int64_t c : layer)
        counts.push(c);
      load.push(std::move(counts));
    }
    JsonValue line = JsonValue::object({
        {"step", completed},
        {"loss", lossValue},
        {"lr", lr},
        {"tokens_per_s", tokensPerSecond},
        {"mfu", peak > 0 ? JsonValue(3.0 * flopsPerToken * tokensPerSecond / peak)
                         : JsonValue(nullptr)},
        {"grad_norm", gradNorm},
        {"expert_load", std::move(load)},
    });
    if (forcedRouting)
      line.set("routing_flips", model.routingFlips());
    if (cuda)
      line.set("cuda_graph", replayed);
    // Peak memory of every rank (one entry alone).
    std::vector<double> hostPeaks = {peakHostGiB()}, devicePeaks = {cuda ? peakDeviceGiB(opts.device.index() < 0 ? 0 : opts.device.index()) : 0.0};
    if (opts.distributed) {
      std::vector<torch::Tensor> gathered =
          opts.distributed->world().allGather(torch::tensor({hostPeaks[0], devicePeaks[0]}, torch::kFloat64));
      hostPeaks.clear();
      devicePeaks.clear();
      for (const torch::Tensor &rank : gathered) {
        hostPeaks.push_back(rank[0].item<double>());
        devicePeaks.push_back(rank[1].item<double>());
      }
    }
    JsonValue hostMemory = JsonValue::array(), deviceMemory = JsonValue::array();
    for (size_t r = 0; r < hostPeaks.size(); ++r) {
      hostMemory.push(hostPeaks[r]);
      deviceMemory.push(devicePeaks[r]);
    }
    line.set("peak_host_gib", std::move(hostMemory));
    if (cuda)
      line.set("peak_device_gib", std::move(deviceMemory));
    if (opts.distributed) {
      // Tokens each expert-parallel rank ran per MoE layer (its experts' share).
      const int64_t ep = opts.distributed->layout().ep;
      JsonValue perRank = JsonValue::array();
      for (const std::vector<int64_t> &layer : expertLoad) {
        JsonValue ranks = JsonValue::array();
        if (!layer.empty())
          for (int64_t r = 0; r < ep; ++r) {
            int64_t tokens = 0;
            const int64_t local = static_cast<int64_t>(layer.size()) / ep;
            for (int64_t e = r * local; e < (r + 1) * local; ++e)
              tokens += layer[static_cast<size_t>(e)];
            ranks.push(tokens);
          }
        perRank.push(std::move(ranks));
      }
      line.set("expert_load_per_ep_rank", std::move(perRank));
      line.set("layout", opts.distributed->layout().text());
      line.set("tokens_per_s_per_rank",
               tokensPerSecond / static_cast<double>(opts.distributed->launch().worldSize));
      line.set("allreduce_s", allReduceSeconds);
      line.set("alltoall_s", takeAllToAllSeconds());
      line.set("tp_allreduce_s", takeTensorParallelSeconds());
      if (opts.distributed->layout().pp > 1) { // The longest wait of any stage.
        std::vector<torch::Tensor> waits =
            opts.distributed->world().allGather(torch::tensor({pipelineWaitSeconds}, torch::kFloat64));
        double longest = 0.0;
        for (const torch::Tensor &w : waits)
          longest = std::max(longest, w.item<double>());
        line.set("pipeline_wait_s", longest);
      }
    }
    // Eval after the step, every evalEvery steps and at the last one.
    const bool evalNow = eval && (completed == opts.steps || (opts.evalEvery > 0 && completed % opts.evalEvery == 0));
    double evalValue = std::nan("");
    if (completed == 1 && std::isfinite(untrainedEval))
      line.set("eval_loss_untrained", untrainedEval);
    if (evalNow) {
      evalValue = evalLoss(*eval);
      line.set("eval_loss", std::isfinite(evalValue) ? JsonValue(evalValue) : JsonValue(nullptr));
    }
    if (writes()) {
      appendMetrics(line.dump());
      std::vector<std::pair<std::string, double>> scalars = {
          {"train/loss", lossValue}, {"train/lr", lr}, {"train/grad_norm", gradNorm},
          {"perf/tokens_per_s", tokensPerSecond}};
      if (peak > 0)
        scalars.push_back({"perf/mfu", 3.0 * flopsPerToken * tokensPerSecond / peak});
      if (std::isfinite(evalValue))
        scalars.push_back({"eval/loss", evalValue});
      tensorBoard->addScalars(completed, scalars);
      if (std::isfinite(evalValue)) {
        std::fprintf(stderr, "%sstep %lld: eval loss %.4f%s\n", tty ? "\r\x1b[K" : "", (long long)completed,
                     evalValue, bestEvalLoss == 0 || evalValue < bestEvalLoss ? " (best so far: OUT/best-adapter)" : "");
        if (bestEvalLoss == 0 || evalValue < bestEvalLoss)
          saveBestAdapter(evalValue);
        writeReport();
      }
    }

    const double elapsed = std::chrono::duration<double>(now - runStart).count();
    const double perStep = elapsed / static_cast<double>(completed - firstStep);
    char progress[256];
    std::snprintf(progress, sizeof(progress),
                  "step %lld/%lld  loss %.4f  lr %.3g  %.0f tok/s  ETA %s",
                  (long long)completed, (long long)opts.steps, lossValue, lr, tokensPerSecond,
                  durationText(perStep * static_cast<double>(opts.steps - completed)).c_str());
    bool fullLine = opts.logEvery > 0 && (completed % opts.logEvery == 0 || completed == opts.steps);
    if (!writes()) {
    } else if (tty) {
      std::fprintf(stderr, "\r%s\x1b[K%s", progress, fullLine ? "\n" : "");
    } else if (fullLine) {
      std::fprintf(stderr, "%s\n", progress);
    }

    profiler.afterStep(index);
    if (opts.checkpointEvery > 0 && completed % opts.checkpointEvery == 0)
      saveCheckpoint();
  }
  if (checkpointStep != completed)
    saveCheckpoint();
  reportKernels(/*final=*/true);
  writeReport();
  if (!opts.gradientsPath.empty() && writes())
    writeSafetensors(opts.gradientsPath, gradients);
  if (tty && !(opts.logEvery > 0))
    std::fprintf(stderr, "\n");
  return 0;
}

//===----------------------------------------------------------------------===//
// Export and merge
//===----------------------------------------------------------------------===//

void exportAdapter(const Model &model, const std::string &modelDir, const std::string &outDir) {
  exportAdapter(model, modelDir, outDir, nullptr);
}

void exportAdapter(const Model &model, const std::string &modelDir, const std::string &outDir,
                   Distributed *run) {
  const std::vector<AdapterTensor> adapters = model.adapters();
  std::vector<torch::Tensor> wholes;
  for (const AdapterTensor &a : adapters)
    wholes.push_back(gatherShard(a, a.value.detach(), run).to(torch::kCPU, torch::kFloat).contiguous().clone());
  assembleStages(adapters, wholes, run);
  if (run && run->rank() != 0)
    return;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (size_t i = 0; i < adapters.size(); ++i)
    tensors.emplace_back(adapters[i].peftKey, wholes[i]);
  createDirectories(outDir);
  std::string config = model.peftConfigJson(absolutePath(modelDir));
  try {
    parseJson(config, "adapter_config.json");
  } catch (const RuntimeError &e) {
    throw RuntimeError(e.file, e.field, "the generated adapter config is not JSON: " + e.expected,
                       kExitInternal);
  }
  writeSafetensors(joinPath(outDir, "adapter_model.safetensors"), tensors, {{"format", "pt"}});
  writeFileAtomic(joinPath(outDir, "adapter_config.json"), config);
}

namespace {

/// Files of a model folder that are weights (never copied by merge).
bool isWeightFile(const std::string &name) {
  for (const char *ext : {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5",
                          ".msgpack", ".onnx", ".index.json"})
    if (endsWith(name, ext))
      return true;
  return false;
}

} // namespace

void mergeModel(const Model &model, const std::string &modelDir, const std::string &outDir,
                uint64_t maxShardBytes) {
  std::string modelPath = canonicalPath(modelDir);
  if (!modelPath.empty() && modelPath == canonicalPath(outDir))
    throw badInput(outDir, "--merge",
                   "expected a folder other than the base model's (its shards are read "
                   "while the merged ones are written)");
  CheckpointReader reader(modelDir);
  std::vector<std::pair<std::string, torch::Tensor>> merged = model.mergedWeights();
  std::unordered_map<std::string, size_t> mergedIndex;
  for (size_t i = 0; i < merged.size(); ++i)
    mergedIndex.emplace(merged[i].first, i);

  // Keep the checkpoint's order; a merged tensor takes the place of the
  // stored tensor (or quantization companion) it replaces.
  std::vector<std::pair<std::string, torch::Tensor>> all;
  std::vector<bool> placed(merged.size(), false);
  bool droppedQuantization = false;
  auto place = [&](const std::string &name) {
    auto it = mergedIndex.find(name);
    if (it == mergedIndex.end())
      return false;
    if (!placed[it->second]) {
      all.push_back(merged[it->second]);
      placed[it->second] = true;
    }
    return true;
  };
  for (const std::string &name : reader.namesInShardOrder()) {
    if (place(name))
      continue;
    bool companion = false;
    for (const char *suffix : {"_blocks", "_scales", "_scale_inv"}) {
      if (!endsWith(name, suffix))
        continue;
      std::string base = name.substr(0, name.size() - std::strlen(suffix));
      auto it = mergedIndex.find(base);
      // An FP8 merged tensor keeps needing its scale.
      if (it != mergedIndex.end() &&
          !(std::string(suffix) == "_scale_inv" &&
            merged[it->second].second.scalar_type() == torch::kFloat8_e4m3fn)) {
        place(base);
        companion = droppedQuantization = true;
      }
    }
    if (!companion)
      all.emplace_back(name, reader.view(name));
  }
  for (size_t i = 0; i < merged.size(); ++i)
    if (!placed[i])
      all.push_back(merged[i]);
  writeShardedCheckpoint(outDir, all, maxShardBytes);

  // config.json is copied as is, unless the merged weights are no longer
  // quantized: then without its quantization_config.
  std::string config = joinPath(modelDir, "config.json");
  if (droppedQuantization && pathExists(config)) {
    JsonValue json = readJsonFile(config);
    if (json.isObject())
      json.erase("quantization_config");
    writeFileAtomic(joinPath(outDir, "config.json"), json.dump(2) + "\n");
  }
  for (const std::string &name : listDirectory(modelDir)) {
    std::string from = joinPath(modelDir, name);
    if (!isRegularFile(from) || isWeightFile(name) ||
        (name == "config.json" && droppedQuantization))
      continue;
    copyFileAtomic(from, joinPath(outDir, name));
  }
  fsyncDirectory(outDir);
}

} // namespace adapt::rt
