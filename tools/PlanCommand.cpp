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

int usageError(const std::string &message) {
  std::cerr << "adapt: error: " << message << "\nusage:\n" << kPlanUsage;
  return kExitBadInput;
}

/// An integer flag in [lo, hi].
bool parseCount(const std::string &text, int64_t lo, int64_t hi, int64_t &out) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  out = std::stoll(text);
  return out >= lo && out <= hi;
}

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

int runPlanCommand(int argc, char **argv) {
  plan::PlanRequest request;
  std::string path, out, registry;
  bool gpusGiven = false;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage:\n" << kPlanUsage;
      return kExitOk;
    }
    auto value = [&](std::string &into) { return takeFlagValue(argc, argv, i, into); };
    std::string text;
    if (arg.rfind("--", 0) == 0 && arg != "--out" && arg != "--registry" && !value(text))
      return usageError(arg + " expects a value");
    if (arg == "--gpus") {
      if (!parseCount(text, 1, 1 << 20, request.gpus))
        return usageError("--gpus expects an integer in 1..1048576, found \"" + text + "\"");
      gpusGiven = true;
    } else if (arg == "--gpus-per-node") {
      if (!parseCount(text, 1, 1024, request.gpusPerNode))
        return usageError("--gpus-per-node expects an integer in 1..1024, found \"" + text + "\"");
    } else if (arg == "--gpu-memory") {
      if (!parseBytes(text, request.gpuMemoryBytes))
        return usageError("--gpu-memory expects a size from 1GiB to 16TiB such as 141GiB or 80GB, found \"" +
                          text + "\"");
    } else if (arg == "--seq-len") {
      if (!parseCount(text, 1, int64_t(1) << 26, request.seqLen))
        return usageError("--seq-len expects an integer in 1..67108864, found \"" + text + "\"");
    } else if (arg == "--global-batch") {
      if (!parseCount(text, 1, int64_t(1) << 30, request.globalBatch))
        return usageError("--global-batch expects a number of sequences >= 1, found \"" + text + "\"");
    } else if (arg == "--micro-batch") {
      if (!parseCount(text, 1, 1 << 20, request.microBatch))
        return usageError("--micro-batch expects a number of sequences >= 1, found \"" + text + "\"");
    } else if (arg == "--lora-rank") {
      if (!parseCount(text, 1, 65536, request.loraRank))
        return usageError("--lora-rank expects an integer in 1..65536, found \"" + text + "\"");
    } else if (arg == "--lora-targets") {
      std::string error;
      if (!parseTargets(text, request, error))
        return usageError(error);
    } else if (arg == "--dtype") {
      if (text != "bf16" && text != "fp8")
        return usageError("--dtype expects bf16 or fp8, found \"" + text + "\"");
      request.fp8Weights = text == "fp8";
    } else if (arg == "--out" || arg == "--registry") {
      if (!value(arg == "--out" ? out : registry))
        return usageError(arg + " expects a value");
    } else if (arg.rfind("--", 0) == 0) {
      return usageError("unknown option " + arg);
    } else if (path.empty()) {
      path = arg;
    } else {
      return usageError("unexpected argument " + arg);
    }
  }
  if (path.empty())
    return usageError("plan expects a PATH (a model folder or config.json)");
  if (!gpusGiven)
    return usageError("plan expects --gpus N");
  if (request.globalBatch > 0 && request.globalBatch % request.microBatch)
    return usageError("--global-batch must be a multiple of --micro-batch");

  mlir::MLIRContext context;
  context.getOrLoadDialect<AdaptDialect>();
  Analysis analysed;
  if (int code = analyseModel(context, {path, registry, /*runPasses=*/true}, analysed))
    return code;
  if (!analysed.files)
    return usageError(path + ": plan needs a Hugging Face model folder (config.json), not ONNX");
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
