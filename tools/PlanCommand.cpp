//===- PlanCommand.cpp - `adapt plan` -------------------------------------===//
//
//   adapt plan PATH --gpus N [--gpus-per-node 8] [--gpu-memory 139GiB]
//              [--seq-len T] [--global-batch B] [--micro-batch M]
//              [--lora-targets a,b] [--lora-rank R] [--dtype bf16|fp8]
//              [--out DIR]
//
// Reads and analyses PATH in-process (tools/ModelAnalysis.h), then plans
// (planner/): prints the verdict and the best layouts, and with --out writes
// plan.json, plan.md and plan.html.
//
//===----------------------------------------------------------------------===//

#include "tools/PlanCommand.h"
#include "tools/CommandLine.h"

#include "ir/AdaptDialect.h"
#include "parser/InputError.h"
#include "planner/PlanWriter.h"
#include "tools/ModelAnalysis.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/CommandLine.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace adapt {

const char *const kPlanUsage =
    "  adapt plan PATH --gpus N [--gpus-per-node 8] [--gpu-memory 139GiB] [--seq-len T]\n"
    "             [--global-batch B] [--micro-batch M] [--lora-targets a,b] [--lora-rank R]\n"
    "             [--dtype bf16|fp8] [--out DIR]\n";

namespace {

int usage(const std::string &message) { return usageError(message, kPlanUsage); }

cl::SubCommand planCommand("plan", "Choose the parallel layout for training on N GPUs");
cl::opt<std::string> pathFlag(cl::Positional, cl::sub(planCommand),
                              cl::desc("PATH (a model folder or config.json)"));
/// The numeric flags, parsed straight into a request (cl::location):
/// PlanRequest's member defaults are theirs.
plan::PlanRequest requestFlags;
FieldFlag<int64_t> gpusFlag("gpus", planCommand, requestFlags.gpus, "GPUs, 1..1048576");
FieldFlag<int64_t> gpusPerNodeFlag("gpus-per-node", planCommand, requestFlags.gpusPerNode, "1..1024");
cl::opt<std::string> gpuMemoryFlag("gpu-memory", cl::sub(planCommand),
                                   cl::desc("memory per GPU, e.g. 141GiB or 80GB"));
FieldFlag<int64_t> seqLenFlag("seq-len", planCommand, requestFlags.seqLen, "tokens per sequence");
FieldFlag<int64_t> globalBatchFlag("global-batch", planCommand, requestFlags.globalBatch, "sequences per step");
FieldFlag<int64_t> microBatchFlag("micro-batch", planCommand, requestFlags.microBatch,
    "sequences per micro-batch");
FieldFlag<int64_t> loraRankFlag("lora-rank", planCommand, requestFlags.loraRank, "1..65536");
cl::opt<std::string> loraTargetsFlag("lora-targets", cl::sub(planCommand),
                                     cl::desc("targets, e.g. q_proj,experts or all-linear"));
cl::opt<std::string> dtypeFlag("dtype", cl::sub(planCommand), cl::desc("bf16 or fp8"));
cl::opt<std::string> outFlag("out", cl::sub(planCommand), cl::desc("plan folder"));
cl::opt<std::string> registryFlag("registry", cl::sub(planCommand),
                                  cl::desc("an op registry in place of the built-in one"));

/// "141GiB", "141GB", "0.5TiB" or bytes.
bool parseBytes(const std::string &text, double &out) {
  char *end = nullptr;
  out = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(out > 0) || !std::isfinite(out))
    return false;
  const std::string unit = end;
  const double scale = unit.empty() || unit == "B" ? 1.0
                       : unit == "GiB"             ? double(1ull << 30)
                       : unit == "GB"              ? 1e9
                       : unit == "TiB"             ? double(1ull << 40)
                       : unit == "MiB"             ? double(1ull << 20)
                                                   : 0.0;
  out *= scale;
  return scale > 0 && out >= double(1ull << 30) && out <= double(1ull << 44);
}

/// Which LoRA targets a --lora-targets list names, as the planner counts them.
bool parseTargets(const std::string &text, plan::PlanRequest &r, std::string &error) {
  r.loraAttention = r.loraExperts = r.loraMlp = false;
  std::stringstream list(text);
  for (std::string t; std::getline(list, t, ',');) {
    if (t == "all-linear")
      r.loraAttention = r.loraExperts = r.loraMlp = true;
    else if (t == "q_proj" || t == "k_proj" || t == "v_proj" || t == "o_proj" || t == "attention" ||
             t == "in_proj_qkvz" || t == "out_proj" || t == "qkv_proj")
      r.loraAttention = true;
    else if (t == "experts")
      r.loraExperts = true;
    else if (t == "gate_proj" || t == "up_proj" || t == "down_proj" || t == "mlp" || t == "shared_experts")
      r.loraMlp = true;
    else if (!t.empty()) {
      error = "--lora-targets: unknown target '" + t +
              "'; expected q_proj, k_proj, v_proj, o_proj, attention, experts, gate_proj, up_proj, down_proj, "
              "mlp or all-linear";
      return false;
    }
  }
  if (!r.loraAttention && !r.loraExperts && !r.loraMlp) {
    error = "--lora-targets expects at least one target";
    return false;
  }
  return true;
}

std::string gibText(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1ull << 30));
  return b;
}

} // namespace

int runPlanCommand() {
  plan::PlanRequest request = requestFlags;
  const std::string path = pathFlag, out = outFlag, registry = registryFlag;
  for (const std::string &error :
       {rangeError("--gpus", request.gpus, 1, 1 << 20),
        rangeError("--gpus-per-node", request.gpusPerNode, 1, 1024),
        rangeError("--seq-len", request.seqLen, 1, int64_t(1) << 26),
        globalBatchFlag.getNumOccurrences()
            ? rangeError("--global-batch", request.globalBatch, 1, int64_t(1) << 30)
            : "",
        rangeError("--micro-batch", request.microBatch, 1, 1 << 20),
        rangeError("--lora-rank", request.loraRank, 1, 65536)})
    if (!error.empty())
      return usage(error);
  if (gpuMemoryFlag.getNumOccurrences() && !parseBytes(gpuMemoryFlag, request.gpuMemoryBytes))
    return usage("--gpu-memory expects a size from 1GiB to 16TiB such as 141GiB or 80GB, found \"" +
                 gpuMemoryFlag + "\"");
  std::string error;
  if (loraTargetsFlag.getNumOccurrences() && !parseTargets(loraTargetsFlag, request, error))
    return usage(error);
  if (dtypeFlag.getNumOccurrences()) {
    if (dtypeFlag != "bf16" && dtypeFlag != "fp8")
      return usage("--dtype expects bf16 or fp8, found \"" + dtypeFlag + "\"");
    request.fp8Weights = dtypeFlag == "fp8";
  }
  if (path.empty())
    return usage("plan expects a PATH (a model folder or config.json)");
  if (!gpusFlag.getNumOccurrences())
    return usage("plan expects --gpus N");
  if (request.globalBatch > 0 && request.globalBatch % request.microBatch)
    return usage("--global-batch must be a multiple of --micro-batch");

  mlir::MLIRContext context;
  context.getOrLoadDialect<AdaptDialect>();
  Analysis analysed;
  if (int code = analyseModel(context, {path, registry, /*runPasses=*/true}, analysed))
    return code;
  if (!analysed.files)
    return usage(path + ": plan needs a Hugging Face model folder (config.json), not ONNX");
  const plan::Hardware &hardware = plan::h200();
  plan::ModelFacts facts = plan::modelFacts(analysed.files->spec, analysed.report.parameters, request);
  plan::Plan result = plan::makePlan(facts, request, hardware);

  std::cout << "model        " << facts.name << ": " << facts.layers << " layers, " << facts.moeLayers
            << " MoE (" << facts.experts << " experts, top-" << facts.topK << ")\n";
  if (analysed.report.hasGaps())
    std::cout << "note         the runtime cannot train this model yet (" << analysed.report.summary
              << "; `adapt gaps`): the plan assumes the missing operators run like the library's\n";
  std::cout << "layouts      " << result.layoutsConsidered << " considered on " << request.gpus << " GPUs\n";
  if (result.chosen >= 0) {
    const plan::Candidate &c = result.candidates[size_t(result.chosen)];
    std::printf("chosen       %s: %.0f tokens/s, %s on the busiest GPU, %.3f s per step\n",
                c.layout.text().c_str(), c.tokensPerSecond, gibText(c.memory.total()).c_str(), c.time.total());
    for (size_t i = 1; i < result.candidates.size() && i < 4; ++i)
      std::printf("runner-up    %s: %s\n", result.candidates[i].layout.text().c_str(),
                  result.candidates[i].verdict.c_str());
  } else {
    std::cout << "refused      " << result.refusal << "\n";
    for (const std::string &s : result.suggestions)
      std::cout << "would fit    " << s << "\n";
  }
  if (!out.empty()) {
    std::string error;
    if (!plan::writePlan(result, out, error)) {
      std::cerr << "adapt: error: " << out << ": " << error << "\n";
      return kExitBadInput;
    }
    std::cout << "wrote " << out << "/plan.json, plan.md, plan.html\n";
  }
  return result.chosen >= 0 ? kExitOk : kExitGapsFound;
}

} // namespace adapt
