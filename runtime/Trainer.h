//===- Trainer.h - LoRA training loop, checkpoints, export -----*- C++ -*-===//
//
// The training loop of a generated trainer: AdamW over the model's adapters
// only, linear warmup then cosine decay, gradient clipping, one metrics line
// per step, and checkpoints that make --resume bitwise exact on CPU fp32.
// Batches are a pure function of the step (PackedDataset), dropout is seeded
// from (seed, step) at every step, and the checkpoint stores the fp32
// adapters and every AdamW moment exactly, so nothing else carries state.
//
// OUT/checkpoint is replaced atomically: the new one is written to
// OUT/checkpoint.tmp (every file fsynced), the old one renamed to
// OUT/checkpoint.old, the new one renamed into place, the old one removed.
// recoverCheckpointFolder repairs whatever a crash between those steps left.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TRAINER_H
#define ADAPT_RUNTIME_TRAINER_H

#include "runtime/Dataset.h"
#include "runtime/Errors.h"
#include "runtime/Json.h"
#include "runtime/Model.h"
#include "runtime/StepGraph.h"
#include "runtime/TensorBoard.h"

#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace adapt::rt {

class SafetensorsFile;

/// Everything the trainer CLI sets (see trainMain's --help for defaults).
struct TrainOptions {
  std::string modelDir;
  std::string dataPath;  ///< JSONL or ADAPTTOK; required when training.
  std::string outDir;    ///< metrics.jsonl and checkpoint/ live here.
  std::string exportDir; ///< "": no PEFT export.
  std::string mergeDir;  ///< "": no merged checkpoint.
  int64_t steps = 0;     ///< Total optimizer steps of the run (resume continues to it).
  int64_t batch = 8;
  int64_t seqLen = 512;
  double lr = 1e-4;
  double weightDecay = 0.0;
  int64_t warmup = 0;    ///< Linear warmup steps.
  /// After warmup: "cosine" (to 0 at the last step), "linear" (to 0) or
  /// "constant".
  std::string schedule = "cosine";
  /// Held-out data for an eval loss ("": none): every evalEvery steps (0:
  /// only at the end) and at the end, over evalBatches batches of `batch`
  /// windows (0: every window once). The lowest eval loss's adapter is
  /// exported to OUT/best-adapter.
  std::string evalDataPath;
  int64_t evalEvery = 0, evalBatches = 0;
  uint64_t seed = 0;
  /// LoRA settings chosen at train time (--lora-rank/--lora-alpha/
  /// --lora-dropout/--rslora); 0 or -1: as `adapt build` generated them.
  int64_t loraRank = 0;
  double loraAlpha = 0.0, loraDropout = -1.0;
  bool rslora = false;
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
  double gradClip = 1.0; ///< <= 0: no clipping (the norm is still logged).
  int64_t checkpointEvery = 100; ///< 0: only at the end and on a signal.
  bool resume = false;
  int64_t logEvery = 10; ///< Steps between full progress lines on stderr.
  int64_t eos = -1;      ///< Appended after every document when >= 0.
  bool packing = true;   ///< false: every document starts a window (DatasetOptions).
  double peakFlops = 0;  ///< For MFU; 0: 989e12 for CUDA bf16, else none.
  /// "": routers choose. Else a safetensors file of forced experts per step
  /// and MoE block ("<step>.<block path>" -> [B*T, k]; Model::forceRouting).
  std::string forceRoutingPath;
  /// A parallel run (runtime/Distributed.h): each data rank trains its slice
  /// of every global batch, gradients are reduced, and rank 0 alone writes
  /// metrics, checkpoints and exports (whole tensors). Null: alone.
  std::shared_ptr<Distributed> distributed;
  /// "": none. Else every step's whole adapter gradients (reduced, before
  /// clipping) are written there at the end ("<step>.<peft key>"), for the
  /// parallel stage's comparison with a single-process run.
  std::string gradientsPath;
  /// Gradient accumulation: each (per-rank) batch runs as this many equal
  /// micro-batches, their gradients summed before the step; the loss and
  /// gradients are those of the whole batch (the same normalisation as a
  /// parallel run's, so DP2 equals one process with 2 micro-batches).
  int64_t microBatches = 1;
  /// --profile N: Kineto over N steps from the run's second step (its first
  /// when it has no more than N), written to OUT/profile (runtime/Profiler.h).
  int64_t profileSteps = 0;
  /// A single-process CUDA run without micro-batches, LoRA dropout or
  /// gradient dumps replays its steps from the third (after the profiled
  /// ones) as one captured CUDA graph (runtime/StepGraph.h); false:
  /// --no-cuda-graphs, every step eager.
  bool cudaGraphs = true;
};

/// Learning rate of the step with 0-based index \p index: lr * (index + 1) /
/// warmup during warmup, then options.schedule from lr: cosine or linear to
/// 0 at options.steps, or constant.
double learningRate(const TrainOptions &options, int64_t index);

/// The process-wide "stop after this step" flag SIGINT/SIGTERM set.
/// installStopSignalHandlers sets SA_RESETHAND, so a second signal kills.
void installStopSignalHandlers();
/// The signal number that asked to stop, or 0.
int stopRequested();

/// Restores OUT/checkpoint from OUT/checkpoint.old when a crash left only
/// the old one, and removes leftovers (checkpoint.tmp, a stale .old).
void recoverCheckpointFolder(const std::string &outDir);

/// OUT/checkpoint: where the trainer keeps its latest checkpoint.
std::string checkpointDir(const std::string &out);

/// The training loop around one Model.
class Trainer {
public:
  /// Builds AdamW over model.adapters() (betas 0.9/0.999, eps 1e-8).
  Trainer(Model &model, const TrainOptions &options);
  ~Trainer();

  /// Loads OUT/checkpoint into the adapters and optimizer when it exists;
  /// returns its step (0 when there is none). A checkpoint that does not
  /// fit the model (other adapters or shapes) is a RuntimeError, exit 2.
  int64_t restore();
  /// Completed optimizer steps.
  int64_t step() const { return completed; }

  /// Trains from step() to options.steps on \p data, appending to
  /// OUT/metrics.jsonl (first cut back to step()). Returns 0, or 130 when a
  /// signal asked to stop (after a checkpoint). A loss or gradient norm
  /// that is not finite throws RuntimeError with exit code 5 ("loss is NaN
  /// at step S; last good checkpoint at step K kept in OUT/checkpoint"),
  /// leaving the checkpoint as it was; write failures throw exit code 6.
  int run(const PackedDataset &data);
  /// run() with held-out \p eval data (options.evalDataPath, packed alike)
  /// for eval_loss in the metrics and OUT/best-adapter.
  int run(const PackedDataset &data, const PackedDataset *eval);

  /// Writes OUT/checkpoint for step(), atomically (see the file comment).
  void saveCheckpoint();

  /// The "options" object of OUT/checkpoint/trainer_state.json, for
  /// --resume to reuse settings that are not given again; an empty object
  /// when there is no checkpoint.
  static JsonValue savedOptions(const std::string &outDir);
  /// Whether OUT/checkpoint holds a complete checkpoint.
  static bool hasCheckpoint(const std::string &outDir);

private:
  void truncateMetrics();
  void appendMetrics(const std::string &line);
  int interrupted(int signal);
  std::string checkpointNote() const;

  /// Rewrites OUT/report.html (rank 0; a failure only warns).
  void writeReport() const;
  /// On a GPU, which guarded ops ran their CUDA kernels (runtime/KernelLedger.h):
  /// OUT/kernels.json with the tally so far, after the first step and at the
  /// end (\p final); after the first step also a line on stderr, with a
  /// warning for calls a kernel refused.
  void reportKernels(bool final) const;
  /// The mean next-token loss over \p eval's first options.evalBatches
  /// batches (every target token counted once; dropout off, no gradient).
  double evalLoss(const PackedDataset &eval);
  /// Exports the adapters to OUT/best-adapter (via best-adapter.tmp and a
  /// rename), with adapt_eval.json giving the step and eval loss.
  void saveBestAdapter(double loss);
  /// Whether this process writes files (alone, or rank 0 of a parallel run).
  bool writes() const { return !opts.distributed || opts.distributed->rank() == 0; }
  /// One step's loss and gradients: alone, model.loss and backward; in a
  /// parallel run, this rank's slice, then gradients reduced. Returns the
  /// global loss; ALLREDUCE_SECONDS receives the gradient reduction's time.
  double lossAndGradients(const Batch &batch, double &allReduceSeconds);
  /// Step \p index run op by op: gradients, clipping (its norm returned),
  /// AdamW, and in a parallel run the reductions. Throws exit 5 on a
  /// non-finite loss or norm, before the update.
  StepGraph::Result eagerStep(const Batch &batch, int64_t index, double &allReduceSeconds);
  /// The step as a CUDA graph replay: captures it the first time (then
  /// prints whether the graph is used). False when the step must run eagerly
  /// (capture failed, or \p batch has other shapes); else \p result holds
  /// its loss and gradient norm (non-finite: the update was skipped).
  bool graphStep(const Batch &batch, double lr, StepGraph::Result &result);
  /// The error of a non-finite loss or gradient norm at step \p index (exit 5).
  RuntimeError notFinite(const char *what, double value, int64_t index) const;
  /// The gradient clipping bound (infinity: none).
  double maxNorm() const { return opts.gradClip > 0 ? opts.gradClip : std::numeric_limits<double>::infinity(); }

  Model &model;
  TrainOptions opts;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::vector<AdapterTensor> params;  ///< Every adapter tensor (checkpoints hold them all).
  std::vector<AdapterTensor> trained; ///< Those this rank trains (its pipeline stage's).
  /// Per trained tensor: whether this rank steps it and holds its AdamW
  /// state (ZeRO-1: the replicas of a tensor share that work).
  std::vector<bool> owned;
  double pipelineWaitSeconds = 0.0;   ///< The last step's time blocked on other stages.
  int64_t completed = 0;
  int64_t checkpointStep = -1; ///< Step of OUT/checkpoint; -1: none.
  int metricsFd = -1;
  std::string restoredFingerprint; ///< The checkpoint's data fingerprint.
  std::string currentFingerprint;
  double lastLoss = 0, lastLr = 0;
  double bestEvalLoss = 0; ///< Of OUT/best-adapter; 0: none yet.
  std::unique_ptr<TensorBoardWriter> tensorBoard; ///< OUT/tensorboard, opened by run().
  std::unique_ptr<SafetensorsFile> forcedRouting; ///< opts.forceRoutingPath, open.
  std::vector<std::pair<std::string, torch::Tensor>> gradients; ///< For opts.gradientsPath.
  std::unique_ptr<StepGraph> graph; ///< The captured step (TrainOptions::cudaGraphs).
  bool graphTried = false;          ///< Whether capture was tried (once per run).
  int64_t graphFrom = 0;            ///< The first step index a replay may run.
  /// Forces step \p index's routing from forcedRouting (BadInput when it has none).
  void forceRoutingOf(int64_t index);
};

/// Writes adapter_model.safetensors (fp32, PEFT keys) and adapter_config.json
/// into \p outDir; exit code 6 on a write failure.
void exportAdapter(const Model &model, const std::string &modelDir,
                   const std::string &outDir);
/// exportAdapter for a parallel run: every rank calls it (split expert
/// adapters are gathered), rank 0 writes the whole adapter.
void exportAdapter(const Model &model, const std::string &modelDir, const std::string &outDir,
                   Distributed *run);

/// Writes a full checkpoint into \p outDir: model.mergedWeights() plus every
/// other tensor of \p modelDir unchanged (quantization companions of merged
/// tensors are dropped, and then quantization_config leaves config.json), as
/// shards of at most \p maxShardBytes, the index, config.json and the other
/// small files of the model folder (tokenizer, generation config).
void mergeModel(const Model &model, const std::string &modelDir,
                const std::string &outDir, uint64_t maxShardBytes = 5'000'000'000ull);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_TRAINER_H
