//===- TrainerCheckpoint.cpp - the trainer's checkpoints ------------------===//
//
// Checkpoint layout (OUT/checkpoint/):
//   adapters.safetensors   every adapter, fp32, under its PEFT key
//   optimizer.safetensors  "<key>.exp_avg", "<key>.exp_avg_sq" (fp32) and
//                          "<key>.step" (I64 scalar) per adapter that has
//                          AdamW state
//   trainer_state.json     format, version, step, last loss and lr, the
//                          data fingerprint and the run's options
//   SHA256SUMS             the digests of the three files above
//
// Written into checkpoint.tmp and swapped in by renames (the previous one
// kept as checkpoint.old until the new one is in place);
// recoverCheckpointFolder repairs what a crash between the renames left.
//
//===----------------------------------------------------------------------===//
#include "runtime/Trainer.h"
#include "runtime/FileSystem.h"
#include "runtime/ParallelStep.h"
#include "runtime/SafetensorsIO.h"
#include "runtime/Sha256.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace adapt::rt {

namespace {

std::string dtypeFlag(torch::ScalarType t) { return t == torch::kBFloat16 ? "bf16" : "fp32"; }

constexpr const char *kStateFormat = "adapt-trainer-checkpoint";
constexpr int64_t kStateVersion = 1;
/// The files of a checkpoint that SHA256SUMS covers (sha256sum -c reads it too).
constexpr const char *kCheckpointFiles[] = {"adapters.safetensors", "optimizer.safetensors",
                                            "trainer_state.json"};
/// Throws BadInput (exit 2) when a checkpoint file's SHA-256 differs from
/// the one SHA256SUMS recorded when it was written: bit flips or edits.
void verifyCheckpointDigests(const std::string &ck) {
  const std::string sumsPath = joinPath(ck, "SHA256SUMS");
  if (!pathExists(sumsPath))
    throw badInput(sumsPath, "", "expected the checkpoint's digests (written with every checkpoint)");
  std::map<std::string, std::string> listed;
  std::ifstream sums(sumsPath);
  for (std::string line; std::getline(sums, line);) {
    const size_t split = line.find("  ");
    if (split == 64)
      listed[line.substr(split + 2)] = line.substr(0, 64);
  }
  for (const char *name : kCheckpointFiles) {
    auto it = listed.find(name);
    if (it == listed.end())
      throw badInput(sumsPath, name, "expected a SHA-256 line for this checkpoint file");
    if (sha256File(joinPath(ck, name)) != it->second)
      throw badInput(joinPath(ck, name), "SHA-256",
                     "expected the bytes the trainer wrote (SHA256SUMS); the file changed since, "
                     "so it is not loaded");
  }
}

} // namespace

std::string checkpointDir(const std::string &out) { return joinPath(out, "checkpoint"); }

void recoverCheckpointFolder(const std::string &outDir) {
  std::string ck = checkpointDir(outDir), old = joinPath(outDir, "checkpoint.old"),
              tmp = joinPath(outDir, "checkpoint.tmp");
  if (pathExists(tmp))
    removeAll(tmp);
  if (pathExists(old)) {
    if (!pathExists(ck)) {
      renamePath(old, ck);
      std::fprintf(stderr, "note: restored %s from %s (a checkpoint write was interrupted)\n",
                   ck.c_str(), old.c_str());
      fsyncDirectory(outDir);
    } else {
      removeAll(old);
    }
  }
}

bool Trainer::hasCheckpoint(const std::string &outDir) {
  return pathExists(joinPath(checkpointDir(outDir), "trainer_state.json"));
}

JsonValue Trainer::savedOptions(const std::string &outDir) {
  if (!hasCheckpoint(outDir))
    return JsonValue::object();
  JsonValue state = readJsonFile(joinPath(checkpointDir(outDir), "trainer_state.json"));
  const JsonValue *options = state.find("options");
  return options && options->isObject() ? *options : JsonValue::object();
}

int64_t Trainer::restore() {
  if (!hasCheckpoint(opts.outDir))
    return 0;
  std::string ck = checkpointDir(opts.outDir);
  verifyCheckpointDigests(ck);
  std::string statePath = joinPath(ck, "trainer_state.json");
  JsonValue state = readJsonFile(statePath);
  const JsonValue *format = state.find("format");
  const JsonValue *version = state.find("version");
  const JsonValue *step = state.find("step");
  if (!format || !format->isString() || format->asString() != kStateFormat)
    throw badInput(statePath, "format", std::string("expected \"") + kStateFormat + "\"");
  if (!version || !version->isInt() || version->asInt() != kStateVersion)
    throw badInput(statePath, "version",
                   "expected " + std::to_string(kStateVersion) +
                       " (a checkpoint written by this trainer version)");
  if (!step || !step->isInt() || step->asInt() < 0)
    throw badInput(statePath, "step", "expected a non-negative integer");
  if (const JsonValue *fp = state.find("data_fingerprint"); fp && fp->isString())
    restoredFingerprint = fp->asString();

  std::string adapterPath = joinPath(ck, "adapters.safetensors");
  SafetensorsFile adapters(adapterPath);
  if (adapters.tensors().size() != params.size())
    throw badInput(adapterPath, "tensors",
                   "expected " + std::to_string(params.size()) +
                       " adapter tensors (this model's LoRA targets) but the "
                       "checkpoint has " + std::to_string(adapters.tensors().size()));
  std::string optimPath = joinPath(ck, "optimizer.safetensors");
  SafetensorsFile optim(optimPath);
  torch::NoGradGuard noGrad;
  std::set<const void *> ownedImpls;
  for (size_t i = 0; i < trained.size(); ++i)
    if (owned[i])
      ownedImpls.insert(trained[i].value.unsafeGetTensorImpl());
  for (const AdapterTensor &p : params) {
    torch::Tensor saved = adapters.view(p.peftKey);
    const Distributed *run = opts.distributed.get();
    const std::vector<int64_t> whole = wholeShape(p, run);
    if (saved.scalar_type() != torch::kFloat || saved.sizes() != c10::IntArrayRef(whole))
      throw badInput(adapterPath, p.peftKey,
                     "expected F32 " + c10::str(whole) +
                         " (this model's adapter) but found " +
                         c10::toString(saved.scalar_type()) + " " + c10::str(saved.sizes()));
    p.value.copy_(shardOf(p, saved, run));
    // The owner's state only (ZeRO-1; another stage's tensors have none here).
    if (!optimizer || !ownedImpls.count(p.value.unsafeGetTensorImpl()) || !optim.find(p.peftKey + ".step"))
      continue;
    auto moment = [&](const char *suffix) {
      torch::Tensor t = optim.view(p.peftKey + suffix);
      if (t.scalar_type() != torch::kFloat || t.sizes() != c10::IntArrayRef(whole))
        throw badInput(optimPath, p.peftKey + suffix,
                       "expected F32 " + c10::str(whole) + " but found " +
                           c10::toString(t.scalar_type()) + " " + c10::str(t.sizes()));
      return shardOf(p, t, run).to(p.value.device(), p.value.scalar_type(), /*non_blocking=*/false,
                                   /*copy=*/true);
    };
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(optim.view(p.peftKey + ".step").to(torch::kLong).item<int64_t>());
    st->exp_avg(moment(".exp_avg"));
    st->exp_avg_sq(moment(".exp_avg_sq"));
    optimizer->state()[p.value.unsafeGetTensorImpl()] = std::move(st);
  }
  completed = checkpointStep = step->asInt();
  return completed;
}

std::string Trainer::checkpointNote() const {
  std::string ck = checkpointDir(opts.outDir);
  if (checkpointStep < 0)
    return "no checkpoint was written yet";
  return "last good checkpoint at step " + std::to_string(checkpointStep) + " kept in " + ck;
}

void Trainer::saveCheckpoint() {
  const std::string &out = opts.outDir;
  std::string ck = checkpointDir(out), tmp = joinPath(out, "checkpoint.tmp"),
              old = joinPath(out, "checkpoint.old");
  // Whole tensors (split experts gathered: every rank takes part), so any
  // layout can resume; rank 0 alone touches the folder.
  std::vector<std::pair<std::string, torch::Tensor>> adapterTensors, optimTensors;
  Distributed *run = opts.distributed.get();
  // A parallel run holds each tensor's AdamW state on one replica (ZeRO-1)
  // of one pipeline stage: the others add zeros (step 0 with zero moments is
  // a fresh AdamW state) and every tensor comes from its owner.
  std::vector<AdapterTensor> moments;
  std::vector<torch::Tensor> values, averages, squares, steps;
  std::vector<bool> owners;
  for (const AdapterTensor &p : params) {
    values.push_back(gatherShard(p, p.value.detach(), run).to(torch::kCPU, torch::kFloat).clone());
    auto it = optimizer ? optimizer->state().find(p.value.unsafeGetTensorImpl()) : decltype(optimizer->state().end()){};
    const bool has = optimizer && it != optimizer->state().end();
    if (!has && !run)
      continue;
    torch::Tensor average, square;
    int64_t step = 0;
    if (has) {
      auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
      average = st.exp_avg().clone(), square = st.exp_avg_sq().clone(), step = st.step();
    } else {
      average = torch::zeros_like(p.value.detach()), square = torch::zeros_like(p.value.detach());
    }
    moments.push_back(p);
    owners.push_back(has);
    averages.push_back(average);
    squares.push_back(square);
    steps.push_back(torch::tensor({step}, torch::kLong));
  }
  shareFromOwners(moments, owners, averages, run);
  shareFromOwners(moments, owners, squares, run);
  shareFromOwners(moments, owners, steps, run);
  for (size_t i = 0; i < moments.size(); ++i) {
    averages[i] = gatherShard(moments[i], averages[i], run).to(torch::kCPU).clone();
    squares[i] = gatherShard(moments[i], squares[i], run).to(torch::kCPU).clone();
  }
  assembleStages(params, values, run);
  assembleStages(moments, averages, run);
  assembleStages(moments, squares, run);
  assembleStages(moments, steps, run);
  for (size_t i = 0; i < params.size(); ++i)
    adapterTensors.emplace_back(params[i].peftKey, values[i]);
  for (size_t i = 0; i < moments.size(); ++i) {
    optimTensors.emplace_back(moments[i].peftKey + ".exp_avg", averages[i]);
    optimTensors.emplace_back(moments[i].peftKey + ".exp_avg_sq", squares[i]);
    optimTensors.emplace_back(moments[i].peftKey + ".step", steps[i].reshape({}));
  }
  if (!writes()) {
    checkpointStep = completed;
    return;
  }
  removeAll(tmp);
  createDirectories(tmp);
  // Test hook for the end-to-end tests: a full disk at this step.
  const char *failAt = std::getenv("ADAPT_TEST_FAIL_CHECKPOINT_AT_STEP");
  bool injectFailure = failAt && std::atoll(failAt) == completed;
  try {
    JsonValue options = JsonValue::object({
        {"data", opts.dataPath.empty() ? std::string() : absolutePath(opts.dataPath)},
        {"steps", opts.steps},
        {"batch", opts.batch},
        {"seq_len", opts.seqLen},
        {"lr", opts.lr},
        {"weight_decay", opts.weightDecay},
        {"warmup", opts.warmup},
        {"schedule", opts.schedule},
        {"seed", static_cast<int64_t>(opts.seed)},
        // The LoRA settings in effect (generated or given), which a resumed
        // run keeps.
        {"lora_rank", model.def().lora.rank},
        {"lora_alpha", model.def().lora.alpha},
        {"lora_dropout", model.def().lora.dropout},
        {"rslora", model.def().lora.rslora},
        {"grad_clip", opts.gradClip},
        {"eos", opts.eos},
        {"packing", opts.packing},
        {"dtype", dtypeFlag(opts.dtype)},
        {"checkpoint_every", opts.checkpointEvery},
        {"log_every", opts.logEvery},
    });
    JsonValue state = JsonValue::object({
        {"format", kStateFormat},
        {"version", kStateVersion},
        {"step", completed},
        {"loss", lastLoss},
        {"lr", lastLr},
        {"data_fingerprint", currentFingerprint},
        {"options", std::move(options)},
    });
    if (injectFailure)
      failWritesAfterForTesting(64);
    writeSafetensors(joinPath(tmp, "adapters.safetensors"), adapterTensors, {{"format", "pt"}});
    writeSafetensors(joinPath(tmp, "optimizer.safetensors"), optimTensors);
    writeFileAtomic(joinPath(tmp, "trainer_state.json"), state.dump(2) + "\n");
    std::string sums;
    for (const char *name : kCheckpointFiles)
      sums += sha256File(joinPath(tmp, name)) + "  " + name + "\n";
    writeFileAtomic(joinPath(tmp, "SHA256SUMS"), sums);
    fsyncDirectory(tmp);
    failWritesAfterForTesting(-1);
  } catch (const RuntimeError &e) {
    failWritesAfterForTesting(-1);
    removeAll(tmp);
    std::string kept = checkpointStep >= 0
                           ? "the previous checkpoint (step " + std::to_string(checkpointStep) +
                                 ") is intact in " + ck
                           : "no previous checkpoint exists";
    throw RuntimeError(e.file, e.field,
                       e.expected + "; checkpoint of step " + std::to_string(completed) +
                           " not written, " + kept,
                       e.exitCode);
  }
  if (pathExists(ck)) {
    removeAll(old);
    renamePath(ck, old);
  }
  if (::rename(tmp.c_str(), ck.c_str()) != 0) {
    int err = errno;
    ::rename(old.c_str(), ck.c_str());
    throw writeError(ck, "rename from " + tmp, err);
  }
  fsyncDirectory(out);
  removeAll(old);
  checkpointStep = completed;
  writeReport();
}

} // namespace adapt::rt
