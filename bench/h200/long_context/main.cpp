//===- main.cpp - long-context memory and time of linear and sparse blocks ===//
//
// Forward + backward (bf16, LoRA r16 on every projection, frozen base) of the
// token mixers that must not grow quadratically with context, at a given
// length, on one GPU. Prints one JSON line: mixer, tokens, milliseconds per
// forward+backward (median of the timed iterations), peak allocated GiB.
//
//   long_context --mixer gdn|dsa|hybrid --tokens T [--recompute] [--iters N] [--no-warmup] [--profile DIR]
//   long_context --delta-rule B H T DK DV [--iters N] [--per-channel] [--profile DIR]   (the op alone;
//      --per-channel: a decay per key channel, Kimi delta attention's)
//   long_context --lightning B H T D BLOCK [--iters N] [--profile DIR]   (MiniMax's lightning attention alone, blocked)
//
// gdn: Qwen3-Next's Gated DeltaNet (16 key / 32 value heads of 128, conv 4).
// dsa: DeepSeek-V3.2's sparse MLA with top-k 2048 and its 64-head indexer;
//      MLA heads 16 = one tensor-parallel shard of 128 over 8 GPUs.
// hybrid: the mission's 3:1 block, 3 gdn + 1 dsa with residuals, each layer
//      wrapped in recompute() when --recompute is given.
// All at hidden 7168 (DeepSeek-V3.2's width).
//
//===----------------------------------------------------------------------===//

#include "runtime/Lightning.h"
#include "runtime/LinearAttention.h"
#include "runtime/LinearLayers.h"
#include "runtime/Profiler.h"
#include "runtime/Recompute.h"
#include "runtime/SparseAttention.h"

#if __has_include(<cuda_runtime.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define ADAPT_CUDA_STATS 1
#endif
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace adapt::rt;

namespace {

const int64_t kHidden = 7168, kRank = 16;
const auto kDtype = torch::kBFloat16;
const torch::Device kCuda(torch::kCUDA, 0);

torch::Tensor weight(int64_t out, int64_t in) {
  return (torch::randn({out, in}, torch::dtype(torch::kFloat32).device(kCuda)) / std::sqrt(double(in))).to(kDtype);
}

/// A frozen projection with a trainable rank-16 adapter (B random so every
/// adapter's path is live).
LoraLinear linear(int64_t out, int64_t in, bool lora = true) {
  LoraLinear l;
  l.weight = weight(out, in);
  if (lora) {
    auto f32 = torch::dtype(torch::kFloat32).device(kCuda);
    l.loraA = (torch::randn({kRank, in}, f32) / std::sqrt(double(in))).requires_grad_();
    l.loraB = (torch::randn({out, kRank}, f32) * 0.01).requires_grad_();
    l.scale = 2.0;
  }
  return l;
}

torch::Tensor ones(int64_t n) { return torch::ones({n}, torch::dtype(kDtype).device(kCuda)); }

GatedDeltaNetLayer makeGdn() {
  GatedDeltaNetLayer g;
  g.def.keyHeads = 16, g.def.valueHeads = 32, g.def.keyHeadDim = 128, g.def.valueHeadDim = 128;
  g.def.convKernel = 4, g.def.chunkSize = 64;
  const int64_t keyDim = 16 * 128, valueDim = 32 * 128;
  g.inProjQkvz = linear(2 * keyDim + 2 * valueDim, kHidden);
  g.inProjBa = linear(2 * 32, kHidden);
  g.outProj = linear(kHidden, valueDim);
  g.conv = (torch::randn({2 * keyDim + valueDim, 1, 4}, torch::device(kCuda)) * 0.5).to(kDtype);
  g.aLog = torch::log(torch::rand({32}, torch::device(kCuda)) * 15 + 1).to(kDtype);
  g.dtBias = torch::ones({32}, torch::device(kCuda)).to(kDtype);
  g.norm = ones(128);
  return g;
}

AttentionLayer makeDsa() {
  AttentionLayer a;
  AttentionDef &d = a.def;
  d.kind = AttentionKind::SparseMla;
  d.heads = d.kvHeads = 16;
  d.qLoraRank = 1536, d.kvLoraRank = 512, d.qkNopeDim = 128, d.qkRopeDim = 64;
  d.headDim = 192, d.vHeadDim = 128;
  d.rope.rotaryDim = 64, d.rope.interleaved = true;
  d.indexer.heads = 64, d.indexer.headDim = 128, d.indexer.topK = 2048;
  a.qA = linear(1536, kHidden);
  a.qANorm = ones(1536);
  a.qB = linear(16 * 192, 1536);
  a.kvA = linear(512 + 64, kHidden);
  a.kvANorm = ones(512);
  a.kvB = linear(16 * (128 + 128), 512);
  a.o = linear(kHidden, 16 * 128);
  a.indexQ = linear(64 * 128, 1536, false);
  a.indexK = linear(128, kHidden, false);
  a.indexKNorm = ones(128);
  a.indexKNormBias = torch::zeros({128}, torch::dtype(kDtype).device(kCuda));
  a.indexWeights = linear(64, kHidden, false);
  a.indexWeights.weight = a.indexWeights.weight.to(torch::kFloat32);
  return a;
}

/// Peak bytes allocated by LibTorch's CUDA caching allocator since the last
/// reset (-1 where the CUDA headers are missing: a CPU-only syntax check).
double peakGiB() {
#ifdef ADAPT_CUDA_STATS
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return double(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0 * 1024.0);
#else
  return -1;
#endif
}

void resetPeak() {
#ifdef ADAPT_CUDA_STATS
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
#endif
}

/// Median milliseconds of \p iters calls of \p step after one warm-up (none
/// with --no-warmup: the longest lengths), and the peak allocation over the
/// timed calls.
bool warmUp = true;
template <typename F> std::pair<double, double> measure(F step, int iters) {
  if (warmUp)
    step();
  torch::cuda::synchronize();
  resetPeak();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    torch::cuda::synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], peakGiB()};
}

int usage() {
  std::fprintf(stderr, "usage: long_context --mixer gdn|dsa|hybrid --tokens T [--recompute] [--iters N] [--profile DIR]\n"
                       "       long_context --delta-rule B H T DK DV [--iters N] [--per-channel] [--profile DIR]\n"
                       "       long_context --lightning B H T D BLOCK [--iters N] [--profile DIR]\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  std::string mixer;
  int64_t tokens = 0, iters = 3;
  bool recomputeLayers = false;
  std::vector<int64_t> op, lightning;
  std::string profileDir;
  bool perChannel = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mixer" && i + 1 < argc)
      mixer = argv[++i];
    else if (a == "--tokens" && i + 1 < argc)
      tokens = std::atoll(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoll(argv[++i]);
    else if (a == "--recompute")
      recomputeLayers = true;
    else if (a == "--per-channel")
      perChannel = true;
    else if (a == "--profile" && i + 1 < argc)
      profileDir = argv[++i];
    else if (a == "--no-warmup")
      warmUp = false;
    else if (a == "--lightning" && i + 5 < argc)
      for (int k = 0; k < 5; ++k)
        lightning.push_back(std::atoll(argv[++i]));
    else if (a == "--delta-rule" && i + 5 < argc)
      for (int k = 0; k < 5; ++k)
        op.push_back(std::atoll(argv[++i]));
    else
      return usage();
  }
  torch::manual_seed(0);
  if (!lightning.empty()) { // lightning attention alone: bf16 q, k, v [B, H, T, D], MiniMax's slopes
    const int64_t B = lightning[0], H = lightning[1], T = lightning[2], D = lightning[3], block = lightning[4];
    auto opts = torch::dtype(kDtype).device(kCuda);
    torch::Tensor q = (torch::randn({B, H, T, D}, opts) * 0.1).requires_grad_();
    torch::Tensor k = (torch::randn({B, H, T, D}, opts) * 0.1).requires_grad_();
    torch::Tensor v = torch::randn({B, H, T, D}, opts).requires_grad_();
    torch::Tensor slopes = lightningSlopes(H, 1, 80);
    torch::Tensor cot = torch::randn({B, H, T, D}, opts);
    auto [fwd, fwdPeak] =
        measure([&] { torch::NoGradGuard g; lightningAttentionBlocked(q, k, v, slopes, block); }, int(iters));
    auto [both, peak] = measure([&] { lightningAttentionBlocked(q, k, v, slopes, block).backward(cot); }, int(iters));
    if (!profileDir.empty()) { // Kineto over 3 forward + backward calls: DIR/profile/breakdown.md
      StepProfiler profiler(profileDir, 0, 3, /*cuda=*/true, /*loraRank=*/0, /*vocab=*/0);
      for (int64_t i = 0; i < 3; ++i) {
        profiler.beforeStep(i);
        lightningAttentionBlocked(q, k, v, slopes, block).backward(cot);
        torch::cuda::synchronize();
        profiler.afterStep(i);
      }
    }
    // ns per token of forward + backward over all heads, as fla_delta_rule.py counts it.
    std::printf("{\"op\": \"lightning_blocked\", \"B\": %lld, \"H\": %lld, \"T\": %lld, \"d\": %lld, \"block\": %lld, "
                "\"forward_ms\": %.3f, \"forward_backward_ms\": %.3f, \"ns_per_token\": %.1f, \"peak_gib\": %.3f}\n",
                (long long)B, (long long)H, (long long)T, (long long)D, (long long)block, fwd, both,
                both * 1e6 / double(B * T), peak);
    return 0;
  }
  if (!op.empty()) {
    // The gated delta rule alone, as flash-linear-attention's chunk_gated_delta_rule
    // is benchmarked: q, k L2-normalised, bf16 inputs, scalar decay per head.
    int64_t B = op[0], H = op[1], T = op[2], DK = op[3], DV = op[4];
    auto opts = torch::dtype(kDtype).device(kCuda);
    DeltaRuleInputs in;
    in.query = l2Normalize(torch::randn({B, H, T, DK}, opts)).requires_grad_();
    in.key = l2Normalize(torch::randn({B, H, T, DK}, opts)).requires_grad_();
    in.value = torch::randn({B, H, T, DV}, opts).requires_grad_();
    // --per-channel: Kimi delta attention's decay, one per key channel.
    std::vector<int64_t> decayShape = {B, H, T};
    if (perChannel)
      decayShape.push_back(DK);
    in.decay = torch::nn::functional::logsigmoid(torch::randn(decayShape, opts.dtype(torch::kFloat32))).requires_grad_();
    in.beta = torch::rand({B, H, T}, opts).sigmoid().requires_grad_();
    torch::Tensor cot = torch::randn({B, H, T, DV}, opts);
    auto [fwd, fwdPeak] = measure([&] { torch::NoGradGuard g; gatedDeltaRuleChunked(in, 64); }, int(iters));
    auto [both, peak] = measure([&] { gatedDeltaRuleChunked(in, 64).backward(cot); }, int(iters));
    if (!profileDir.empty()) { // Kineto over 3 forward + backward calls: DIR/profile/breakdown.md
      StepProfiler profiler(profileDir, 0, 3, /*cuda=*/true, /*loraRank=*/0, /*vocab=*/0);
      for (int64_t i = 0; i < 3; ++i) {
        profiler.beforeStep(i);
        gatedDeltaRuleChunked(in, 64).backward(cot);
        torch::cuda::synchronize();
        profiler.afterStep(i);
      }
    }
    std::printf("{\"op\": \"gated_delta_rule_chunked\", \"B\": %lld, \"H\": %lld, \"T\": %lld, \"dk\": %lld, "
                "\"dv\": %lld, \"per_channel\": %s, \"forward_ms\": %.3f, \"forward_backward_ms\": %.3f, "
                "\"ns_per_token\": %.1f, \"peak_gib\": %.3f}\n",
                (long long)B, (long long)H, (long long)T, (long long)DK, (long long)DV, perChannel ? "true" : "false",
                fwd, both, both * 1e6 / double(B * T), peak);
    return 0;
  }
  if (tokens <= 0 || (mixer != "gdn" && mixer != "dsa" && mixer != "hybrid"))
    return usage();

  std::vector<GatedDeltaNetLayer> gdn;
  std::vector<AttentionLayer> dsa;
  if (mixer == "gdn")
    gdn.push_back(makeGdn());
  if (mixer == "dsa")
    dsa.push_back(makeDsa());
  if (mixer == "hybrid") {
    for (int k = 0; k < 3; ++k)
      gdn.push_back(makeGdn());
    dsa.push_back(makeDsa());
  }
  RopeDef rope;
  rope.rotaryDim = 64, rope.interleaved = true;
  RopeTables tables = ropeTables(rope, tokens, kCuda);
  torch::Tensor x = torch::randn({1, tokens, kHidden}, torch::dtype(kDtype).device(kCuda));
  torch::Tensor cot = torch::randn_like(x) * 1e-3;

  auto layer = [&](const RecomputedFunction &fn, const torch::Tensor &h) {
    return recomputeLayers ? recompute(fn, h) : fn(h);
  };
  auto step = [&] {
    torch::Tensor h = x;
    for (const GatedDeltaNetLayer &g : gdn)
      h = h + layer([&](const torch::Tensor &in) { return g.forward(in, true); }, h);
    for (const AttentionLayer &a : dsa)
      h = h + layer([&](const torch::Tensor &in) { return sparseMlaForward(a, in, tables, true); }, h);
    h.backward(cot);
  };
  auto [ms, peak] = measure(step, int(iters));
  if (!profileDir.empty()) { // Kineto over 2 forward + backward steps: DIR/profile/breakdown.md
    StepProfiler profiler(profileDir, 0, 2, /*cuda=*/true, /*loraRank=*/16, /*vocab=*/0);
    for (int64_t i = 0; i < 2; ++i) {
      profiler.beforeStep(i);
      step();
      torch::cuda::synchronize();
      profiler.afterStep(i);
    }
  }
  std::printf("{\"mixer\": \"%s\", \"tokens\": %lld, \"recompute\": %s, \"forward_backward_ms\": %.1f, "
              "\"tokens_per_s\": %.0f, \"peak_gib\": %.2f}\n",
              mixer.c_str(), (long long)tokens, recomputeLayers ? "true" : "false", ms, tokens / (ms / 1000.0),
              peak);
  return 0;
}
