//===- TrainMain.cpp - the command line of a generated trainer ------------===//
//
// Parses the flags strictly (every number checked, unknown flags refused),
// resolves defaults (--resume reuses the checkpoint's settings that are not
// given again), then runs: load data, build the model, restore, train,
// export, merge. Every failure reaches the one catch at the bottom, which
// prints "error: ..." and returns the documented exit code.
//
//===----------------------------------------------------------------------===//
#include "runtime/TrainMain.h"
#include "runtime/CommandLine.h"
#include "runtime/Distributed.h"
#include "runtime/ParallelStep.h"
#include "runtime/SafetensorsIO.h"
#include "runtime/Dataset.h"
#include "runtime/Errors.h"
#include "runtime/FileSystem.h"
#include "runtime/GeneratedOps.h"
#include "runtime/Json.h"
#include "runtime/Model.h"
#include "runtime/ModelCost.h"
#include "runtime/TrainConfig.h"
#include "runtime/Trainer.h"
#include "runtime/Validate.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include <unistd.h>

namespace adapt::rt {

std::string trainUsage(const std::string &program, const std::string &defaultModelDir) {
  return "usage: " + program + R"( --out DIR [--data FILE --steps N] [options]

Trains LoRA adapters on this model and writes them where PEFT loads them.

Data and output:
  --model DIR            model folder: config.json + safetensors
                         (default: )" + defaultModelDir + R"()
  --data FILE            training data: JSONL ({"input_ids": [...]} or [...]
                         per line, optional "labels" with -100 = ignore) or the
                         binary ADAPTTOK format (docs/datasets.md)
  --out DIR              run folder (required): metrics.jsonl, checkpoint/
  --export DIR           after training (or alone with --resume): write
                         adapter_model.safetensors + adapter_config.json (PEFT)
  --merge DIR            write the base model with the adapters folded in:
                         safetensors shards, index, config.json, tokenizer files
  --resume               continue from OUT/checkpoint when it exists; settings
                         not given again are the checkpoint's
  --config FILE          settings from a YAML file, one `flag: value` per line
                         (`lr: 2e-4`, `eval-data: eval.jsonl`, `rslora: true`);
                         flags given on the command line override it

Training (defaults in brackets):
  --steps N              total optimizer steps of the run [0; 1000 with --data]
  --epochs N             train for N passes over the data's windows instead:
                         steps = ceil(N * windows / batch) (not with --steps)
  --batch B              sequences per step [8]
  --seq-len T            tokens per sequence [512]
  --lr X                 peak learning rate [1e-4]
  --weight-decay X       AdamW decoupled weight decay [0]
  --warmup N             linear warmup steps, then the schedule [0]
  --schedule S           after warmup: cosine (to 0), linear (to 0) or
                         constant [cosine]
  --eval-data FILE       held-out data (the --data formats): eval_loss in the
                         metrics every --eval-every steps and at the end, and
                         the lowest one's adapter in OUT/best-adapter (PEFT)
  --eval-every N         steps between eval losses; 0 = only at the end [0]
  --eval-batches N       batches of --batch windows per eval [every window once]
  --grad-clip X          clip the global gradient norm to X; 0 = off [1.0]
  --seed N               LoRA init, data shuffle and dropout seed [0]
  --lora-rank R, --lora-alpha A, --lora-dropout P, --rslora
                         LoRA settings for this run, without rebuilding
                         [as `adapt build` generated them; a resumed run
                         keeps the checkpoint's rank]
  --eos ID               token appended after every document [none: document
                         starts are masked from the loss instead]
  --no-packing           start every document at a window (a longer one goes on
                         in the next; the rest is masked padding), so no token
                         attends to another document [documents are packed]
  --device cpu|cuda[:N]  [cuda when available, else cpu]
  --dtype fp32|bf16      base weights and activations; adapters stay fp32
                         [bf16 on cuda, fp32 on cpu]
  --no-cuda-graphs       run every step eagerly. By default a single-process
                         CUDA run captures its third step as a CUDA graph and
                         replays it (the host no longer launches each kernel)
  --recompute            keep only each layer's input and recompute the layer
                         in the backward pass: ~1/3 more compute, activation
                         memory for long contexts [off]
  --recompute-experts    the routed experts keep their tokens instead of their
                         gathered rows and SwiGLU output, and rebuild those in
                         the backward pass: ~40 KB less per token and MoE layer
                         at Qwen3-30B-A3B's widths, for one more gather and
                         SwiGLU pass (CUDA, where the experts' LoRA is fused)
                         [off]
  --checkpoint-every N   steps between checkpoints; 0 = only at the end [100]
  --log-every N          steps between progress lines on stderr; 0 = none [10]
  --peak-tflops X        peak for the mfu metric [989 on cuda bf16, else none]
  --validate FIXTURE     the validation ladder's model stage: compare with a
                         reference fixture (validation/make_fixture.py) and write
                         OUT/model-stage.json/.md; exit 0 pass, 4 fail, 2 bad input
  --init-adapter DIR     start from this PEFT adapter (adapter_model.safetensors
                         with the same targets and rank) instead of a fresh one
  --dump-batches FILE    write every step's input ids and labels as safetensors
                         ("ids.<step>", "labels.<step>"), to train a reference
                         on exactly the same batches
  --force-routing FILE   route every MoE layer's tokens to the experts given in
                         FILE (safetensors, "<step>.<MoE block path>" -> [B*T, k]
                         int64, e.g. the reference's choice) with the weights the
                         router's own scores give them; metrics add routing_flips
                         (tokens the router would have sent elsewhere). Entries
                         "<step>.<indexer path>" -> [B, T, k] int64 key positions
                         replace a sparse-attention indexer's top-k the same way.
                         For loss curves compared across near-tied scores
  --logits-out FILE      at the end, write the first batch's input_ids and
                         logits (fp32) as safetensors, to compare with the
                         reference (transformers + PEFT on the exported adapter)
  --tp N, --ep N, --pp N, --dp N, --cp N
                         parallel layout; the product is the launcher's world
                         size (torchrun: RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/
                         MASTER_PORT; Slurm: SLURM_PROCID/SLURM_NTASKS/...).
                         --ep splits routed experts, --tp attention heads and
                         MLP widths, --pp the layers
                         (stages balanced by FLOPs, 1F1B over --micro-batches),
                         --cp every sequence, --dp and --ep the
                         batch [1; a trainer built with `adapt build --plan`
                         defaults to the plan's layout and recomputation]
  --no-recompute         turn off the plan's recomputation
  --dist-timeout S       a collective waiting longer (a rank died) fails every
                         rank with exit 7 [300]
  --micro-batches N      gradient accumulation: run each batch (each rank's
                         share in a parallel run) as N micro-batches [1]
  --dump-gradients FILE  write every step's whole adapter gradients (reduced,
                         before clipping) as safetensors ("<step>.<peft key>"):
                         the parallel stage compares layouts with them
  --profile N            profile N steps (from the second) with Kineto: a
                         Chrome trace OUT/profile/trace.json and the time by
                         kind (attention, GEMMs, LoRA, experts, router, loss,
                         optimizer, copies, idle) in OUT/profile/breakdown.md;
                         profiled steps run eagerly, the CUDA graph after them
  -h, --help             this text

Every step appends one JSON line to OUT/metrics.jsonl: step, loss, lr,
tokens_per_s, mfu, grad_norm, expert_load (tokens per expert per layer),
eval_loss (steps with an eval), cuda_graph (CUDA runs: whether the step was a
graph replay). The same scalars go to TensorBoard event files
in OUT/tensorboard (`tensorboard --logdir OUT/tensorboard`), and the curves and
expert-load heat maps to OUT/report.html, rewritten at checkpoints and evals.
SIGINT/SIGTERM finish the current step, checkpoint and exit; a second one
kills at once. --resume then repeats an uninterrupted run's losses exactly
(bitwise on CPU fp32).

Exit codes:
  0    success
  1    internal failure (LibTorch error, out of memory)
  2    bad input: flags, missing/truncated shard, shape mismatch, bad dataset,
       token id >= vocabulary size, a checkpoint in --out without --resume
  4    --validate: a comparison with the reference fixture failed
  5    training diverged: loss or gradient norm NaN/Inf; the last good
       checkpoint is kept
  6    write failure (disk full, ...); the previous checkpoint is intact
  7    parallel run: another rank failed, or a collective timed out
  130  interrupted by SIGINT/SIGTERM after a clean checkpoint
)";
}

namespace {

/// Flags taking a value, and the boolean ones.
const std::set<std::string> kValueFlags = {
    "--model", "--data", "--out", "--steps", "--batch", "--seq-len", "--lr", "--weight-decay",
    "--warmup", "--seed", "--device", "--dtype", "--grad-clip", "--checkpoint-every",
    "--log-every", "--export", "--merge", "--eos", "--peak-tflops", "--logits-out", "--validate", "--init-adapter", "--dump-batches",
    "--force-routing", "--tp", "--ep", "--pp", "--dp", "--cp", "--dist-timeout", "--dump-gradients", "--micro-batches", "--profile",
    "--lora-rank", "--lora-alpha", "--lora-dropout", "--eval-data", "--eval-every", "--eval-batches", "--epochs",
    "--schedule", "--config"};
const std::set<std::string> kBoolFlags = {"--resume", "--recompute", "--recompute-experts", "--no-recompute", "--rslora",
                                          "--no-packing", "--no-cuda-graphs",
                                          "--help", "-h"};

torch::ScalarType parseDtype(const std::string &flag, const std::string &text) {
  if (text == "fp32" || text == "float32")
    return torch::kFloat32;
  if (text == "bf16" || text == "bfloat16")
    return torch::kBFloat16;
  throw badInput("", flag, "expected fp32 or bf16 but got '" + text + "'");
}

/// Fills \p o from \p args; with \p saved (the checkpoint's options), flags
/// not given take the saved value, and given ones that differ draw a
/// warning because the resumed run then departs from the original.
TrainOptions resolveOptions(const ParsedFlags &args, const JsonValue &saved,
                            const std::string &defaultModelDir) {
  TrainOptions o;
  auto get = [&](const std::string &flag) -> const std::string * {
    return args.find(flag);
  };
  // The saved value of \p key when \p flag is not given, as flag text.
  auto fromSaved = [&](const std::string &flag, const char *key) -> std::string {
    const JsonValue *v = saved.find(key);
    if (!v || v->isNull())
      return "";
    std::string text = v->isString() ? v->asString() : v->dump();
    if (const std::string *given = get(flag)) {
      bool same = *given == text ||
                  (v->isNumber() && std::strtod(given->c_str(), nullptr) == v->asDouble()) ||
                  (flag == "--data" && absolutePath(*given) == text);
      if (!same)
        std::fprintf(stderr,
                     "warning: %s %s differs from the checkpoint's %s; the resumed run will "
                     "not repeat an uninterrupted one\n",
                     flag.c_str(), given->c_str(), text.c_str());
      return "";
    }
    return text;
  };
  auto value = [&](const std::string &flag, const char *key) -> std::string {
    std::string s = fromSaved(flag, key);
    if (!s.empty())
      return s;
    const std::string *given = get(flag);
    return given ? *given : "";
  };

  o.modelDir = get("--model") ? *get("--model") : defaultModelDir;
  o.outDir = get("--out") ? *get("--out") : "";
  o.dataPath = value("--data", "data");
  o.exportDir = get("--export") ? *get("--export") : "";
  o.mergeDir = get("--merge") ? *get("--merge") : "";
  o.resume = args.has("--resume");
  if (args.has("--epochs") && args.has("--steps"))
    throw badInput("", "--epochs", "expected --epochs or --steps, not both");
  if (std::string s = value("--steps", "steps"); !s.empty())
    o.steps = parseInteger("--steps", s, 0);
  else if (!o.dataPath.empty())
    o.steps = 1000; // --epochs replaces it once the data's windows are known
  if (std::string s = value("--schedule", "schedule"); !s.empty()) {
    if (s != "cosine" && s != "linear" && s != "constant")
      throw badInput("", "--schedule", "expected cosine, linear or constant but got '" + s + "'");
    o.schedule = s;
  }
  if (const std::string *s = get("--eval-data"))
    o.evalDataPath = *s;
  if (const std::string *s = get("--eval-every"))
    o.evalEvery = parseInteger("--eval-every", *s, 0);
  if (const std::string *s = get("--eval-batches"))
    o.evalBatches = parseInteger("--eval-batches", *s, 1);
  if ((args.has("--eval-every") || args.has("--eval-batches")) && o.evalDataPath.empty())
    throw badInput("", args.has("--eval-every") ? "--eval-every" : "--eval-batches", "expected --eval-data with it");
  if (std::string s = value("--batch", "batch"); !s.empty())
    o.batch = parseInteger("--batch", s, 1);
  if (std::string s = value("--seq-len", "seq_len"); !s.empty())
    o.seqLen = parseInteger("--seq-len", s, 2);
  if (std::string s = value("--lr", "lr"); !s.empty())
    o.lr = parseNumber("--lr", s, 0);
  if (std::string s = value("--weight-decay", "weight_decay"); !s.empty())
    o.weightDecay = parseNumber("--weight-decay", s, 0);
  if (std::string s = value("--warmup", "warmup"); !s.empty())
    o.warmup = parseInteger("--warmup", s, 0);
  if (std::string s = value("--seed", "seed"); !s.empty())
    o.seed = static_cast<uint64_t>(parseInteger("--seed", s, 0));
  // LoRA at train time. The rank fixes the adapter's shapes, so a resumed
  // run keeps the checkpoint's. Given flags are checked strictly.
  if (const std::string *s = get("--lora-rank"); s && parseInteger("--lora-rank", *s, 1) > 65536)
    throw badInput("", "--lora-rank", "expected an integer in 1..65536 but got " + *s);
  if (const std::string *s = get("--lora-alpha"); s && !(parseNumber("--lora-alpha", *s, 0) > 0))
    throw badInput("", "--lora-alpha", "expected a number > 0 but got " + *s);
  if (const std::string *s = get("--lora-dropout"); s && !(parseNumber("--lora-dropout", *s, 0) < 1))
    throw badInput("", "--lora-dropout", "expected a number in [0, 1) but got " + *s);
  if (const JsonValue *r = saved.find("lora_rank"); r && r->isNumber() && get("--lora-rank") &&
                                                    parseInteger("--lora-rank", *get("--lora-rank"), 1) != r->asInt())
    throw badInput("", "--lora-rank",
                   "expected the checkpoint's rank " + r->dump() + " when resuming (the adapter's shape)");
  if (std::string s = value("--lora-rank", "lora_rank"); !s.empty() && std::strtod(s.c_str(), nullptr) > 0) {
    o.loraRank = parseInteger("--lora-rank", s, 1);
    if (o.loraRank > 65536)
      throw badInput("", "--lora-rank", "expected an integer in 1..65536 but got " + s);
  }
  if (std::string s = value("--lora-alpha", "lora_alpha"); !s.empty() && std::strtod(s.c_str(), nullptr) != 0) {
    o.loraAlpha = parseNumber("--lora-alpha", s, 0);
    if (!(o.loraAlpha > 0))
      throw badInput("", "--lora-alpha", "expected a number > 0 but got " + s);
  }
  if (std::string s = value("--lora-dropout", "lora_dropout"); !s.empty() && std::strtod(s.c_str(), nullptr) != -1.0) {
    o.loraDropout = parseNumber("--lora-dropout", s, 0);
    if (!(o.loraDropout < 1))
      throw badInput("", "--lora-dropout", "expected a number in [0, 1) but got " + s);
  }
  if (const JsonValue *v = saved.find("rslora"); args.has("--rslora") || (v && v->isBool() && v->asBool()))
    o.rslora = true;
  if (const JsonValue *v = saved.find("packing"); args.has("--no-packing") || (v && v->isBool() && !v->asBool()))
    o.packing = false;
  if (std::string s = value("--grad-clip", "grad_clip"); !s.empty())
    o.gradClip = parseNumber("--grad-clip", s, 0);
  if (std::string s = value("--eos", "eos"); !s.empty())
    o.eos = parseInteger("--eos", s, -1);
  if (std::string s = value("--checkpoint-every", "checkpoint_every"); !s.empty())
    o.checkpointEvery = parseInteger("--checkpoint-every", s, 0);
  if (const std::string *s = get("--force-routing"))
    o.forceRoutingPath = *s;
  if (std::string s = value("--log-every", "log_every"); !s.empty())
    o.logEvery = parseInteger("--log-every", s, 0);
  if (const std::string *s = get("--peak-tflops"))
    o.peakFlops = parseNumber("--peak-tflops", *s, 0) * 1e12;

  if (const std::string *s = get("--device")) {
    if (*s != "cpu" && s->rfind("cuda", 0) != 0)
      throw badInput("", "--device", "expected cpu, cuda or cuda:N but got '" + *s + "'");
    try {
      o.device = torch::Device(*s);
    } catch (const c10::Error &) {
      throw badInput("", "--device", "expected cpu, cuda or cuda:N but got '" + *s + "'");
    }
    if (o.device.is_cuda() && !torch::cuda::is_available())
      throw badInput("", "--device", "expected a CUDA device but LibTorch sees none");
    if (o.device.is_cuda() && o.device.has_index() &&
        o.device.index() >= static_cast<int>(torch::cuda::device_count()))
      throw badInput("", "--device",
                     "expected a device index below " + std::to_string(torch::cuda::device_count()));
  } else {
    o.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  }
  if (std::string s = value("--dtype", "dtype"); !s.empty())
    o.dtype = parseDtype("--dtype", s);
  else
    o.dtype = o.device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  return o;
}

/// A `\r` progress line for weight loading on a terminal.
std::function<void(int64_t, int64_t)> loadProgress() {
  if (!::isatty(STDERR_FILENO))
    return {};
  return [](int64_t done, int64_t total) {
    std::fprintf(stderr, "\rloading weights %lld/%lld\x1b[K%s", (long long)done, (long long)total,
                 done == total ? "\n" : "");
  };
}

/// Copies a PEFT adapter's tensors into the model's adapters: the key sets
/// and shapes must agree exactly.
void loadInitialAdapter(Model &model, const std::string &dir, const Distributed *run) {
  const std::string file = joinPath(dir, "adapter_model.safetensors");
  if (!isRegularFile(file))
    throw badInput(file, "--init-adapter", "expected a PEFT adapter (adapter_model.safetensors) here");
  SafetensorsFile saved(file);
  std::vector<AdapterTensor> adapters = model.adapters();
  if (saved.tensors().size() != adapters.size())
    throw badInput(file, "--init-adapter",
                   "expected " + std::to_string(adapters.size()) + " adapter tensors (this trainer's targets), found " +
                       std::to_string(saved.tensors().size()));
  torch::NoGradGuard noGrad;
  for (AdapterTensor &a : adapters) {
    if (!saved.find(a.peftKey))
      throw badInput(file, a.peftKey, "expected this adapter tensor (same LoRA targets as the trainer)");
    torch::Tensor value = saved.view(a.peftKey);
    if (value.sizes() != c10::IntArrayRef(wholeShape(a, run)))
      throw badInput(file, a.peftKey, "expected the trainer's shape (same rank)");
    a.value.copy_(shardOf(a, value, run).to(a.value.device(), torch::kFloat32));
  }
}

int run(int argc, char **argv, const ModelDef &def, const std::string &defaultModelDir) {
  ParsedFlags args = parseFlags(argc, argv, {kValueFlags, kBoolFlags, {}});
  if (args.has("--help") || args.has("-h")) {
    std::fputs(trainUsage(argc > 0 ? argv[0] : "train", defaultModelDir).c_str(), stdout);
    return kExitSuccess;
  }
  if (args.has("--config")) { // Its settings, where the command line gives none.
    std::set<std::string> valueFlags = kValueFlags, boolFlags = kBoolFlags;
    valueFlags.erase("--config");
    boolFlags.erase("--help");
    boolFlags.erase("-h");
    for (const ConfigSetting &c : readTrainConfig(*args.find("--config"), valueFlags, boolFlags))
      args.values.emplace(c.flag, std::vector<std::string>{c.value});
  }
  if (!args.has("--out"))
    throw badInput("", "--out", "expected the run folder (--out DIR); see --help");
  const std::string outDir = *args.find("--out");
  createDirectories(outDir);
  if (launchFromEnvironment().rank == 0) // Rank 0 alone writes OUT.
    recoverCheckpointFolder(outDir);
  const bool checkpointExists = Trainer::hasCheckpoint(outDir);
  const std::string checkpointPath = joinPath(outDir, "checkpoint");
  // Never write over a checkpoint that cannot be read back: a folder without
  // its trainer_state.json is someone's lost work, not an empty slot.
  if (!checkpointExists && pathExists(checkpointPath))
    throw badInput(checkpointPath, "trainer_state.json",
                   "expected a complete checkpoint, but trainer_state.json is missing; nothing was "
                   "changed: move the folder away to start a new run here");
  if (!checkpointExists && args.has("--resume"))
    throw badInput(checkpointPath, "--resume",
                   "expected a checkpoint to resume from; nothing was changed (without --resume a "
                   "new run starts)");
  if (checkpointExists && !args.has("--resume"))
    throw badInput(joinPath(outDir, "checkpoint"), "--resume",
                   "expected --resume to continue the run that wrote this checkpoint (or "
                   "another --out for a new run)");
  JsonValue saved = args.has("--resume") ? Trainer::savedOptions(outDir) : JsonValue::object();
  TrainOptions opts = resolveOptions(args, saved, defaultModelDir);
  if (opts.steps > 0 && opts.dataPath.empty())
    throw badInput("", "--data", "expected a dataset (JSONL or ADAPTTOK) to train on");
  if (args.has("--dump-gradients"))
    opts.gradientsPath = *args.find("--dump-gradients");
  if (args.has("--micro-batches"))
    opts.microBatches = parseInteger("--micro-batches", *args.find("--micro-batches"), 1);
  opts.cudaGraphs = !args.has("--no-cuda-graphs");
  if (args.has("--profile"))
    opts.profileSteps = parseInteger("--profile", *args.find("--profile"), 1);
  // A parallel run: checked before any weight is read, then the groups formed.
  const LaunchInfo launch = launchFromEnvironment();
  Layout layout;
  bool layoutFlags = false;
  for (auto [flag, size] : {std::pair<const char *, int64_t *>{"--tp", &layout.tp},
                            {"--ep", &layout.ep}, {"--pp", &layout.pp}, {"--dp", &layout.dp},
                            {"--cp", &layout.cp}})
    if (const std::string *text = args.find(flag)) {
      *size = parseInteger(flag, *text, 1);
      layoutFlags = true;
    }
  const PlannedLayout &plan = def.plannedLayout;
  if (plan.present && !layoutFlags) { // adapt build --plan: the plan's layout
    layout = Layout{plan.tp, plan.ep, plan.pp, plan.dp, plan.cp};
    if (plan.processes() != launch.worldSize)
      throw badInput("", "--tp/--ep/--pp/--cp/--dp",
                     "this trainer was built for the planned layout " + layout.text() + " on " +
                         std::to_string(plan.processes()) + " processes, launched with " +
                         std::to_string(launch.worldSize) + ": start " + std::to_string(plan.processes()) +
                         " (torchrun --nproc-per-node, or Slurm tasks), or give the layout flags");
  }
  if (args.has("--recompute") && args.has("--no-recompute"))
    throw badInput("", "--no-recompute", "expected --recompute or --no-recompute, not both");
  const bool recompute =
      args.has("--recompute") || (plan.present && plan.recompute && !layoutFlags && !args.has("--no-recompute"));
  checkLayout(layout, launch.worldSize, def, opts.batch, opts.seqLen);
  if ((opts.batch / layout.dataRanks()) % opts.microBatches != 0)
    throw badInput("", "--micro-batches",
                   "expected a count dividing each rank's batch (" +
                       std::to_string(opts.batch / layout.dataRanks()) + " sequences), got " +
                       std::to_string(opts.microBatches));
  if (layout.cp > 1 && !opts.forceRoutingPath.empty())
    throw badInput("", "--force-routing", "expected a run without --cp (not implemented yet)");
  if (opts.microBatches > 1 && !opts.forceRoutingPath.empty())
    throw badInput("", "--micro-batches", "expected 1 with --force-routing (not implemented yet)");
  // Under a launcher the groups are formed even for one process, so a
  // one-GPU torchrun job runs (and proves) the same NCCL path as many.
  if (launch.launcher != "none") {
    if ((layout.ep > 1 || layout.tp > 1 || layout.pp > 1) && !opts.mergeDir.empty())
      throw badInput("", "--merge",
                     "expected a run without --ep, --tp or --pp: export the adapter (--export), then "
                     "merge it in one process (--init-adapter DIR --merge OUT)");
    if (layout.pp > 1 && args.has("--logits-out"))
      throw badInput("", "--logits-out", "expected a run without --pp (the logits need every layer)");
    if (args.has("--validate"))
      throw badInput("", "--validate", "expected one process: the model stage runs alone");
    if (opts.device.is_cuda())
      opts.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(launch.localRank));
    const int64_t timeout = args.has("--dist-timeout")
                                ? parseInteger("--dist-timeout", *args.find("--dist-timeout"), 1)
                                : 300;
    opts.distributed = Distributed::join(launch, layout, opts.device, std::chrono::seconds(timeout));
    std::fprintf(stderr, "rank %d of %d (%s, %s%s): data rank %lld, expert rank %lld\n", launch.rank,
                 launch.worldSize, launch.launcher.c_str(), layout.text().c_str(), recompute ? ", recompute" : "",
                 (long long)opts.distributed->dataRank(), (long long)opts.distributed->expertRank());
  }
  // Provenance of every generated operator compiled in (adapt review).
  for (const GeneratedOp &op : generatedOps())
    std::fprintf(stderr, "generated operator: %s (%s; sha256 %.12s; approved by %s)\n",
                 op.component.c_str(), op.task.c_str(), op.sha256.c_str(),
                 op.approvedBy.c_str());
  for (const LayerDef &layer : def.layers)
    for (const std::string *name : {&layer.ffn.generatedRouter, &layer.ffn.generatedActivation,
                                    &layer.attention.generatedCore,
                                    &layer.attention.generatedRope})
      if (!name->empty())
        generatedOp(*name); // Fails before any weight is read.
  if (args.has("--validate")) {
    ModelOptions validateOptions;
    validateOptions.device = torch::kCPU;
    validateOptions.dtype = torch::kFloat32;
    validateOptions.progress = loadProgress();
    Model model(def, opts.modelDir, validateOptions);
    return validateModelStage(model, opts.modelDir, *args.find("--validate"), outDir);
  }
  if (opts.steps == 0 && opts.exportDir.empty() && opts.mergeDir.empty() && !args.has("--logits-out"))
    throw badInput("", "--steps",
                   "expected --data with --steps, --export or --merge: nothing to do");

  // Data first: its errors are cheap to find, the model is not.
  std::unique_ptr<PackedDataset> data, evalData;
  if (opts.steps > 0) {
    data = std::make_unique<PackedDataset>(
        opts.dataPath, DatasetOptions{opts.seqLen, def.vocab, opts.eos, opts.seed, opts.packing});
    std::fprintf(stderr, "data: %s: %lld documents, %lld tokens, %lld windows of %lld\n",
                 opts.dataPath.c_str(), (long long)data->documents(),
                 (long long)data->streamTokens(), (long long)data->windows(),
                 (long long)opts.seqLen);
    if (args.has("--epochs")) {
      const int64_t epochs = parseInteger("--epochs", *args.find("--epochs"), 1);
      opts.steps = (epochs * data->windows() + opts.batch - 1) / opts.batch;
      std::fprintf(stderr, "%lld epochs of %lld windows in batches of %lld: %lld steps\n", (long long)epochs,
                   (long long)data->windows(), (long long)opts.batch, (long long)opts.steps);
    }
  } else if (args.has("--epochs")) {
    throw badInput("", "--epochs", "expected --data with it");
  }
  if (!opts.evalDataPath.empty()) {
    if (opts.distributed)
      throw badInput("", "--eval-data", "expected a run of one process: eval in parallel layouts is not implemented yet");
    if (!opts.forceRoutingPath.empty())
      throw badInput("", "--eval-data", "expected no --force-routing with it (forced routing covers training batches only)");
    // Packed as the training data (same length, EOS and seed).
    evalData = std::make_unique<PackedDataset>(
        opts.evalDataPath, DatasetOptions{opts.seqLen, def.vocab, opts.eos, opts.seed, opts.packing});
    std::fprintf(stderr, "eval data: %s: %lld documents, %lld windows of %lld\n", opts.evalDataPath.c_str(),
                 (long long)evalData->documents(), (long long)evalData->windows(), (long long)opts.seqLen);
  }

  ModelOptions modelOptions;
  modelOptions.device = opts.device;
  modelOptions.dtype = opts.dtype;
  modelOptions.seed = opts.seed;
  modelOptions.progress = loadProgress();
  modelOptions.recomputeLayers = recompute;
  modelOptions.recomputeExpertInputs = args.has("--recompute-experts");
  modelOptions.distributed = opts.distributed;
  if (layout.pp > 1) {
    modelOptions.pipelineBounds = pipelineBoundaries(def, layout.pp, opts.seqLen);
    std::string stages;
    for (int64_t s = 0; s < layout.pp; ++s)
      stages += (s ? ", " : "") + std::to_string(modelOptions.pipelineBounds[s]) + "-" +
                std::to_string(modelOptions.pipelineBounds[s + 1] - 1);
    if (opts.distributed->rank() == 0)
      std::fprintf(stderr, "pipeline stages (layers, by FLOPs): %s; %lld micro-batches\n", stages.c_str(),
                   (long long)opts.microBatches);
  }
  // The LoRA settings of this run: the generated ones unless given.
  ModelDef trained = def;
  if (opts.loraRank > 0)
    trained.lora.rank = opts.loraRank;
  if (opts.loraAlpha > 0)
    trained.lora.alpha = opts.loraAlpha;
  if (opts.loraDropout >= 0)
    trained.lora.dropout = opts.loraDropout;
  if (opts.rslora)
    trained.lora.rslora = true;
  Model model(trained, opts.modelDir, modelOptions);
  if (args.has("--init-adapter"))
    loadInitialAdapter(model, *args.find("--init-adapter"), opts.distributed.get());
  if (args.has("--dump-batches") && data) {
    std::vector<std::pair<std::string, torch::Tensor>> batches;
    for (int64_t step = 0; step < opts.steps; ++step) {
      Batch b = data->batch(step, opts.batch);
      batches.push_back({"ids." + std::to_string(step), b.ids});
      batches.push_back({"labels." + std::to_string(step), b.labels});
    }
    writeSafetensors(*args.find("--dump-batches"), batches);
  }

  if (opts.steps > 0 || opts.resume) {
    Trainer trainer(model, opts);
    int64_t start = opts.resume ? trainer.restore() : 0;
    if (start > 0)
      std::fprintf(stderr, "resumed from %s at step %lld\n",
                   joinPath(outDir, "checkpoint").c_str(), (long long)start);
    if (opts.steps > start) {
      installStopSignalHandlers();
      if (!data)
        throw badInput("", "--data", "expected a dataset (JSONL or ADAPTTOK) to train on");
      int code = trainer.run(*data, evalData.get());
      if (code != kExitSuccess)
        return code;
      std::fprintf(stderr, "trained %lld steps; checkpoint in %s\n", (long long)trainer.step(),
                   joinPath(outDir, "checkpoint").c_str());
    }
  }
  if (!opts.exportDir.empty()) {
    exportAdapter(model, opts.modelDir, opts.exportDir, opts.distributed.get());
    std::fprintf(stderr, "exported the adapter to %s\n", opts.exportDir.c_str());
  }
  if (!opts.mergeDir.empty()) {
    mergeModel(model, opts.modelDir, opts.mergeDir);
    std::fprintf(stderr, "wrote the merged model to %s\n", opts.mergeDir.c_str());
  }
  if (args.has("--logits-out")) {
    if (!data)
      data = std::make_unique<PackedDataset>(
          opts.dataPath, DatasetOptions{opts.seqLen, def.vocab, opts.eos, opts.seed, opts.packing});
    Batch first = data->batch(0, opts.batch);
    torch::NoGradGuard noGrad;
    torch::Tensor logits = model.logits(first.ids).cpu(); // Every rank: expert exchanges.
    if (launch.rank == 0)
      writeSafetensors(*args.find("--logits-out"), {{"input_ids", first.ids}, {"logits", logits}});
  }
  return kExitSuccess;
}

/// Ends a `\r` progress line on a terminal before an error is printed.
const char *lineBreak() { return ::isatty(STDERR_FILENO) ? "\n" : ""; }

} // namespace

int trainMain(int argc, char **argv, const ModelDef &def, const std::string &defaultModelDir) {
  try {
    return run(argc, argv, def, defaultModelDir);
  } catch (const RuntimeError &e) {
    std::fprintf(stderr, "%serror: %s\n", lineBreak(), e.what());
    return e.exitCode;
  } catch (const c10::DistError &e) {
    // A peer died (its connection closed) or a collective timed out.
    std::string what = e.what_without_backtrace();
    if (size_t nl = what.find('\n'); nl != std::string::npos)
      what.resize(nl);
    std::fprintf(stderr, "%serror: parallel run: another rank failed or timed out: %s\n",
                 lineBreak(), what.c_str());
    return kExitPeerFailed;
  } catch (const c10::Error &e) {
    std::string what = e.what_without_backtrace();
    if (size_t nl = what.find('\n'); nl != std::string::npos)
      what.resize(nl);
    std::fprintf(stderr, "%serror: LibTorch: %s\n", lineBreak(), what.c_str());
    return kExitInternal;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%serror: %s\n", lineBreak(), e.what());
    return kExitInternal;
  }
}

std::vector<std::string> trainFlags() {
  std::vector<std::string> all(kValueFlags.begin(), kValueFlags.end());
  all.insert(all.end(), kBoolFlags.begin(), kBoolFlags.end());
  return all;
}

} // namespace adapt::rt
