//===- Planner.cpp - parallel layout, memory and step time of a run -------===//

#include "planner/Planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace adapt::plan {

namespace {

constexpr double kGiB = double(1ull << 30);

std::vector<int64_t> divisorsOf(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

std::string gib(double bytes) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << bytes / kGiB << " GiB";
  return s.str();
}

/// Bandwidth of a group of \p size ranks spaced \p stride apart: NVLink when
/// the group stays inside one node, the network otherwise.
double groupBandwidth(int64_t size, int64_t stride, const PlanRequest &r, const Hardware &h) {
  return size * stride <= r.gpusPerNode ? h.intraNodeBytesPerS : h.interNodeBytesPerS;
}

/// Activation elements kept per token by one softmax-attention layer (its
/// norm input and output, q/k/v before and after norm and RoPE, the output
/// and the output projection's input), TP splitting the head-sized ones.
double attentionElements(const ModelFacts &f, int64_t tp) {
  return 3.0 * f.hidden + (4.0 * (f.queryWidth + 2.0 * f.keyValueWidth) + 2.0 * f.queryWidth) / tp;
}

/// Activation elements kept per token by an MoE layer: the router input in
/// fp32, and per routed copy its dispatched row, gate/up output and
/// activation. The fused experts' node does not keep the expert output (it
/// combines its rows itself, FusedExperts.cpp); activationScale
/// (Hardware.cpp) was fitted with this count.
double moeElements(const ModelFacts &f, int64_t tp) {
  return 2.0 * f.hidden + f.topK * (f.hidden + 3.0 * f.expertWidth) + 3.0 * f.sharedWidth / tp;
}

/// Lightning attention's chunk on the GPU (the delta rule's kernels, which
/// it runs on at width 128: cuda::kChunk).
constexpr double kLightningChunk = 64.0;

/// Activation elements kept per token by one lightning layer: as a softmax
/// layer's (attentionElements) with q, k and v all of the lightning width,
/// plus each chunk's entering state (heads x d x d per 64 tokens, bf16),
/// which its kernels keep for the backward.
double lightningElements(const ModelFacts &f, int64_t tp) {
  const double w = double(f.lightningWidth);
  return 3.0 * f.hidden + (14.0 * w + w * f.lightningHeadDim / kLightningChunk) / tp;
}

/// The runtime's delta-rule segment (LinearAttentionDef::segmentTokens):
/// longer sequences run a delta-rule layer in segments recomputed in the
/// backward pass.
constexpr int64_t kDeltaRuleSegmentTokens = 16384;

/// Bytes per token the delta rule's chunked form keeps for its backward.
double deltaRuleWorkingBytes(const ModelFacts &f, const Hardware &h, int64_t tp) {
  return h.deltaRuleBytesPerToken * (double(f.deltaValueWidth) / 4096.0) / tp;
}

/// Activation bytes per token of an average decoder layer, for sequences of
/// \p seqLen tokens on a rank.
double layerActivationBytes(const ModelFacts &f, const Hardware &h, int64_t tp, int64_t seqLen) {
  const double layers = std::max<int64_t>(f.layers, 1);
  const double softmax = f.softmaxLayers + f.sparseLayers;
  double bytes = softmax / layers * 2.0 * attentionElements(f, tp) * h.activationScale;
  bytes += f.lightningLayers / layers * 2.0 * lightningElements(f, tp) * h.activationScale;
  // A segmented delta-rule layer keeps its normed input and the residual
  // stream (bf16) per token; one segment's working set is a buffer.
  bytes += f.deltaRuleLayers / layers *
           (seqLen > kDeltaRuleSegmentTokens ? 2.0 * 2.0 * f.hidden : deltaRuleWorkingBytes(f, h, tp));
  const double dense = layers - f.moeLayers;
  bytes += f.moeLayers / layers * 2.0 * moeElements(f, tp) * h.activationScale;
  bytes += dense / layers * 2.0 * (2.0 * f.hidden + 3.0 * double(f.denseWidth) / tp) * h.activationScale;
  return bytes;
}

/// Forward + backward FLOPs per token of an average decoder layer, split into
/// the part TP divides (attention, dense MLPs) and the routed experts' part.
std::pair<double, double> layerFlops(const ModelFacts &f, int64_t seqLen) {
  const double layers = std::max<int64_t>(f.layers, 1);
  const double head = f.lmHeadParameters > 0 ? f.lmHeadParameters : f.embeddingParameters;
  const double activeLayer = std::max(0.0, f.activeParameters - head) / layers;
  const double expertActive = f.moeLayers * double(f.topK) * 3.0 * f.hidden * f.expertWidth / layers;
  // Frozen base weights with LoRA: forward 2N, backward (input gradients) 2N.
  const double dense = 4.0 * std::max(0.0, activeLayer - expertActive);
  const double experts = 4.0 * expertActive;
  // Causal attention core: forward 2 matmuls over seqLen/2 keys on average,
  // backward 2.5x forward.
  const double softmax = f.softmaxLayers / layers;
  const double sparse = f.sparseLayers / layers;
  // Lightning (linear) attention's core is costed from its measured time
  // (Hardware::lightningSecondsPerToken), not here.
  const double core = 3.5 * 2.0 * 2.0 * f.queryWidth *
                      (softmax * seqLen / 2.0 + sparse * std::min<double>(f.indexTopK, seqLen / 2.0));
  return {dense + core, experts};
}

/// Seconds per token of the delta rule's op alone at 4,096 value channels:
/// Kimi's per-channel form or GDN's.
double deltaOpSecondsPerToken(const ModelFacts &f, const Hardware &h) {
  return f.perChannelDecay ? h.kimiDeltaOpSecondsPerToken : h.deltaRuleOpSecondsPerToken;
}

/// The wait CP adds to the delta rule (runtime/ContextParallel.h): rank c
/// starts a delta-rule layer's op when rank c-1 has passed its leaving
/// state, so within a run of such layers the ranks form a pipeline, and the
/// layer that synchronises them next waits for the last: (cp - 1) times the
/// op's time on one part, per run, forward and backward, for each
/// micro-batch, at GDN's op or, with Kimi's per-channel decay, Kimi's.
/// Recomputation runs the forward chain a second time in the backward pass:
/// a third more (the forward is about a third of the op's forward and
/// backward). Lightning does not wait: its parts run from zero states at
/// once (LightningLayer.cpp).
double stateChainSeconds(const ModelFacts &f, const Hardware &h, const Layout &l, double tokensPerStep,
                         double stageShare) {
  if (l.cp <= 1 || f.deltaRuleRuns == 0)
    return 0.0;
  const double opPerToken = deltaOpSecondsPerToken(f, h) * double(f.deltaValueWidth) / 4096.0;
  const double runs = std::ceil(f.deltaRuleRuns * stageShare);
  const double recomputed = l.recompute ? 4.0 / 3.0 : 1.0;
  return runs * (l.cp - 1.0) * tokensPerStep * opPerToken * recomputed;
}

} // namespace

std::string Layout::text() const {
  std::ostringstream s;
  s << "TP" << tp << " EP" << ep << " PP" << pp << " CP" << cp << " DP" << dp;
  if (recompute)
    s << " recompute";
  return s.str();
}

ModelFacts modelFacts(const ModelSpec &spec, const ParameterCounts &counts, const PlanRequest &request) {
  ModelFacts f;
  f.name = spec.architecture.empty() ? spec.modelType : spec.architecture;
  f.layers = int64_t(spec.layers.size());
  f.hidden = spec.hidden;
  f.vocab = spec.vocab;
  const double r = double(request.loraRank);
  bool inDeltaRuleRun = false;
  for (const LayerSpec &l : spec.layers) {
    const MixerSpec &m = l.mixer;
    const bool deltaRule = m.kind == MixerKind::GatedDeltaNet || m.kind == MixerKind::KimiDelta;
    if (deltaRule && !inDeltaRuleRun)
      ++f.deltaRuleRuns;
    inDeltaRuleRun = deltaRule;
    double qw = double(m.numHeads) * m.headDim, kvw = double(m.numKvHeads) * m.headDim;
    switch (m.kind) {
    case MixerKind::Attention:
    case MixerKind::MLA:
      if (m.indexTopK > 0) {
        ++f.sparseLayers;
        f.indexTopK = std::max(f.indexTopK, m.indexTopK);
        f.indexWidth = std::max(f.indexWidth, m.indexHeads * m.indexHeadDim);
      } else {
        ++f.softmaxLayers;
      }
      if (m.kind == MixerKind::MLA || m.indexTopK > 0)
        f.tensorSplittable = false;
      f.heads = std::max(f.heads, m.numHeads);
      f.kvHeads = std::max(f.kvHeads, m.numKvHeads);
      break;
    case MixerKind::GatedDeltaNet:
    case MixerKind::KimiDelta:
      ++f.deltaRuleLayers;
      f.perChannelDecay = f.perChannelDecay || m.kind == MixerKind::KimiDelta;
      qw = double(m.linearKeyHeads) * m.linearKeyDim;
      kvw = double(m.linearValueHeads) * m.linearValueDim;
      f.deltaValueWidth = std::max<int64_t>(f.deltaValueWidth, m.linearValueHeads * m.linearValueDim);
      f.tensorSplittable = false;
      break;
    case MixerKind::Lightning:
      ++f.lightningLayers;
      f.lightningWidth = std::max<int64_t>(f.lightningWidth, int64_t(qw));
      f.lightningHeadDim = std::max<int64_t>(f.lightningHeadDim, m.headDim);
      f.tensorSplittable = false;
      break;
    }
    if (m.kind == MixerKind::Attention || m.kind == MixerKind::MLA) {
      f.queryWidth = std::max<int64_t>(f.queryWidth, int64_t(qw));
      f.keyValueWidth = std::max<int64_t>(f.keyValueWidth, int64_t(kvw));
    }
    if (request.loraAttention)
      f.attentionAdapter += r * (4.0 * spec.hidden + 2.0 * qw + 2.0 * kvw);
    const FfnSpec &ffn = l.ffn;
    if (ffn.isMoe) {
      ++f.moeLayers;
      f.experts = std::max(f.experts, ffn.numExperts);
      f.topK = std::max(f.topK, ffn.topK);
      f.expertWidth = std::max(f.expertWidth, ffn.expertIntermediate);
      f.expertCounts.push_back(ffn.numExperts);
      f.sharedWidth = std::max(f.sharedWidth, ffn.numShared * ffn.sharedIntermediate);
      f.expertParameters += double(ffn.numExperts) * 3.0 * spec.hidden * ffn.expertIntermediate;
      if (request.loraExperts)
        f.expertAdapter += double(ffn.numExperts) * r * (2.0 * spec.hidden + 3.0 * ffn.expertIntermediate);
      if (request.loraMlp && ffn.numShared > 0)
        f.mlpAdapter += r * (2.0 * spec.hidden + 3.0 * ffn.numShared * ffn.sharedIntermediate);
    } else {
      f.denseWidth = std::max(f.denseWidth, ffn.intermediate);
      if (request.loraMlp)
        f.mlpAdapter += r * (2.0 * spec.hidden + 3.0 * ffn.intermediate);
    }
  }
  if (f.queryWidth == 0) { // only linear attention: its widths stand in
    for (const LayerSpec &l : spec.layers)
      f.queryWidth = std::max<int64_t>(f.queryWidth, l.mixer.linearKeyHeads * l.mixer.linearKeyDim);
    f.keyValueWidth = f.queryWidth;
  }
  f.totalParameters = double(counts.total);
  f.activeParameters = double(counts.activeWithoutEmbedding);
  f.embeddingParameters = double(counts.embedding);
  f.lmHeadParameters = double(counts.lmHead);
  return f;
}

Candidate estimate(const ModelFacts &f, const PlanRequest &r, const Hardware &h, const Layout &l) {
  Candidate c;
  c.layout = l;
  const int64_t dataRanks = l.dp * l.ep;
  const int64_t globalBatch = r.globalBatch > 0 ? r.globalBatch : 2 * r.gpus;
  const double micro = std::max<int64_t>(1, globalBatch / (dataRanks * r.microBatch));
  const double tokensPerMicro = double(r.microBatch) * r.seqLen / l.cp;
  const double tokensPerStep = micro * tokensPerMicro; // per rank
  const double layersPerStage = std::ceil(double(f.layers) / l.pp);
  const double moeLayersPerStage = std::ceil(double(f.moeLayers) / l.pp);
  const double bytesPerWeight = r.fp8Weights ? 1.0 : 2.0;

  // Memory of the busiest rank (the first stage: it holds the embedding and
  // the most micro-batches in flight; with one stage, the LM head too).
  MemoryEstimate &m = c.memory;
  const double headAndEmbedding = l.pp == 1 ? f.embeddingParameters + f.lmHeadParameters
                                            : std::max(f.embeddingParameters, f.lmHeadParameters);
  const double layerDense = f.totalParameters - f.expertParameters - f.embeddingParameters - f.lmHeadParameters;
  m.weights = (std::max(0.0, layerDense) / (l.tp * l.pp) + headAndEmbedding) * bytesPerWeight;
  m.experts = f.expertParameters / (l.ep * l.pp) * bytesPerWeight;
  const double adapterParams = (f.attentionAdapter / l.tp + f.expertAdapter / l.ep + f.mlpAdapter / l.tp) / l.pp;
  m.adapters = adapterParams * 8.0; // fp32 weight + gradient
  m.optimizer = ((f.attentionAdapter + f.mlpAdapter) / l.tp / dataRanks + f.expertAdapter / l.ep / l.dp) / l.pp * 8.0;
  const int64_t seqPerRank = r.seqLen / std::max<int64_t>(l.cp, 1);
  const double perLayer = layerActivationBytes(f, h, l.tp, seqPerRank) * tokensPerMicro;
  const double inFlight = l.pp > 1 ? std::min<double>(l.pp, micro) : 1.0;
  if (l.recompute)
    m.activations = (layersPerStage * 2.0 * f.hidden * tokensPerMicro) * inFlight + perLayer;
  else
    m.activations = layersPerStage * perLayer * inFlight;
  m.buffers = h.fixedAllocatorBytes * std::max(1.0, tokensPerMicro / 8192.0);
  if (f.deltaRuleLayers > 0 && seqPerRank > kDeltaRuleSegmentTokens) // one segment being recomputed
    m.buffers += deltaRuleWorkingBytes(f, h, l.tp) * double(r.microBatch) * kDeltaRuleSegmentTokens;
  if (l.ep > 1) // send and receive buffers of one MoE layer's dispatch
    m.buffers += 2.0 * tokensPerMicro * f.topK * f.hidden * 2.0;
  m.context = h.contextBytes;
  const double memory = r.gpuMemoryBytes > 0 ? r.gpuMemoryBytes : h.memoryBytes;
  c.fits = m.total() <= memory * (1.0 - kMemoryHeadroom);

  // Step time of the slowest rank, no overlap of communication and compute.
  TimeEstimate &t = c.time;
  auto [denseFlops, expertFlops] = layerFlops(f, r.seqLen);
  double layerSeconds = tokensPerStep * layersPerStage * (denseFlops / l.tp + expertFlops) /
                        (h.bf16Flops * h.layerEfficiency);
  // The token mixers that run far from their FLOP count: the delta rule and
  // lightning attention (latency-bound state recurrences, linear in the
  // tokens) and the DSA indexer (bf16 scores over every earlier key,
  // forward only: its weights are frozen).
  const double stageShare = layersPerStage / std::max<double>(f.layers, 1.0);
  layerSeconds += tokensPerStep * f.deltaRuleLayers * stageShare *
                  (h.deltaRuleLayerRestSecondsPerToken + deltaOpSecondsPerToken(f, h)) *
                  (double(f.deltaValueWidth) / 4096.0);
  layerSeconds += tokensPerStep * f.lightningLayers * stageShare * h.lightningSecondsPerToken *
                  (double(f.lightningWidth) / 8192.0);
  // The indexer scores every earlier key: seqLen / 2 keys per query on one
  // GPU; under CP the last rank's queries (the slowest) see seqLen minus
  // half their own part.
  const double keysPerQuery = r.seqLen - r.seqLen / (2.0 * l.cp);
  layerSeconds += tokensPerStep * f.sparseLayers * stageShare * 2.0 * keysPerQuery * f.indexWidth / h.indexerFlops;
  if (l.recompute)
    layerSeconds *= 1.5;
  const double headSeconds = tokensPerStep * 2.0 * 2.0 * f.hidden * f.vocab / (h.bf16Flops * h.headEfficiency);
  t.compute = layerSeconds + headSeconds;
  const int64_t tpStride = 1, cpStride = l.tp, epStride = l.tp * l.cp;
  if (l.ep > 1 && f.moeLayers > 0) {
    const double bytes = tokensPerStep * f.topK * f.hidden * 2.0 * (l.ep - 1.0) / l.ep;
    t.expertAllToAll = moeLayersPerStage * bytes * (l.recompute ? 6.0 : 4.0) / groupBandwidth(l.ep, epStride, r, h);
  }
  if (l.tp > 1) {
    const double bytes = tokensPerStep * f.hidden * 2.0 * 2.0 * (l.tp - 1.0) / l.tp;
    t.tensorParallel = layersPerStage * 4.0 * bytes / groupBandwidth(l.tp, tpStride, r, h);
  }
  if (l.cp > 1) {
    const double attention = std::ceil(double(f.softmaxLayers) / l.pp);
    const double bytes = tokensPerStep * 2.0 * f.keyValueWidth / l.tp * 2.0 * (l.cp - 1.0);
    // Forward all-gather and backward reduction of the keys and values; a
    // recomputed layer gathers them again.
    t.contextParallel = attention * (l.recompute ? 3.0 : 2.0) * bytes / groupBandwidth(l.cp, cpStride, r, h);
    t.contextParallel += stateChainSeconds(f, h, l, tokensPerStep, stageShare);
  }
  // Adapter gradients are summed over every rank that saw other tokens:
  // CP x EP x DP for the replicated ones, CP x DP for the experts' (EP shards
  // them). Ring all-reduce: 2 (n - 1) / n of the bytes.
  auto ring = [](double bytes, double n) { return n > 1 ? bytes * 2.0 * (n - 1.0) / n : 0.0; };
  const double replicated = (f.attentionAdapter + f.mlpAdapter) / l.tp / l.pp * 4.0;
  const double sharded = f.expertAdapter / l.ep / l.pp * 4.0;
  t.dataParallel = ring(replicated, double(l.cp * l.ep * l.dp)) / groupBandwidth(l.cp * l.ep * l.dp, cpStride, r, h) +
                   ring(sharded, double(l.cp * l.dp)) / groupBandwidth(l.cp * l.ep * l.dp, cpStride, r, h);
  if (l.pp > 1) {
    const double perMicro = (t.compute + t.expertAllToAll + t.tensorParallel + t.contextParallel) / micro;
    t.bubble = (l.pp - 1.0) * perMicro;
    const double stageBytes = tokensPerMicro * f.hidden * 2.0 * 2.0; // activation forward, gradient back
    t.bubble += micro * stageBytes / groupBandwidth(l.pp, l.tp * l.cp * l.ep * l.dp, r, h);
  }
  c.tokensPerSecond = double(globalBatch) * r.seqLen / t.total();
  return c;
}

namespace {

/// Every legal layout, estimated and ranked (no verdicts, no suggestions).
Plan rankLayouts(const ModelFacts &f, const PlanRequest &r, const Hardware &h) {
  Plan plan;
  plan.facts = f;
  plan.request = r;
  plan.hardware = &h;
  const int64_t globalBatch = r.globalBatch > 0 ? r.globalBatch : 2 * r.gpus;
  plan.request.globalBatch = globalBatch;
  plan.rules = {
      "TP x EP x PP x CP x DP = GPUs; ranks ordered TP innermost, then CP, EP, DP, PP",
      "TP only inside a node and only when every token mixer is softmax GQA/MHA; TP divides the query and key/value heads",
      "EP divides the routed experts of every MoE layer (1 for dense models)",
      "PP at most the number of decoder layers",
      "CP divides the sequence length",
      "the data ranks (DP x EP) times the micro-batch divide the global batch",
      "each layout with and without per-layer recomputation (with CP, a recomputed layer repeats its forward "
      "context exchange in the backward pass)"};
  int64_t expertGcd = 0;
  for (int64_t e : f.expertCounts)
    expertGcd = std::gcd(expertGcd, e);
  for (int64_t tp : divisorsOf(r.gpus)) {
    if (tp > r.gpusPerNode || (tp > 1 && (!f.tensorSplittable || f.heads % tp || f.kvHeads % tp)))
      continue;
    for (int64_t ep : divisorsOf(r.gpus / tp)) {
      if (ep > 1 && (expertGcd == 0 || expertGcd % ep))
        continue;
      for (int64_t pp : divisorsOf(r.gpus / (tp * ep))) {
        if (pp > f.layers)
          continue;
        for (int64_t cp : divisorsOf(r.gpus / (tp * ep * pp))) {
          if (cp > 1 && r.seqLen % cp)
            continue;
          const int64_t dp = r.gpus / (tp * ep * pp * cp);
          if (globalBatch % (dp * ep * r.microBatch))
            continue;
          for (bool recompute : {false, true}) {
            ++plan.layoutsConsidered;
            plan.candidates.push_back(estimate(f, plan.request, h, Layout{tp, ep, pp, cp, dp, recompute}));
          }
        }
      }
    }
  }
  // Fitting layouts first, fastest first (non-fitting: smallest first).
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(), [](const Candidate &a, const Candidate &b) {
    if (a.fits != b.fits)
      return a.fits;
    return a.fits ? a.tokensPerSecond > b.tokensPerSecond : a.memory.total() < b.memory.total();
  });
  // Within 1 % of the fastest, the field's recipe picks: no recomputation,
  // fewer pipeline stages, less CP, TP before DP; that one moves to the front.
  if (!plan.candidates.empty() && plan.candidates.front().fits) {
    const double fastest = plan.candidates.front().tokensPerSecond;
    auto recipe = [](const Candidate &c) {
      return std::make_tuple(c.layout.recompute, c.layout.pp, c.layout.cp, -c.layout.tp);
    };
    auto pick = plan.candidates.begin();
    for (auto it = plan.candidates.begin(); it != plan.candidates.end() && it->fits &&
                                            it->tokensPerSecond >= 0.99 * fastest;
         ++it)
      if (recipe(*it) < recipe(*pick))
        pick = it;
    std::rotate(plan.candidates.begin(), pick, pick + 1);
  }
  if (!plan.candidates.empty() && plan.candidates.front().fits)
    plan.chosen = 0;
  return plan;
}

} // namespace

Plan makePlan(const ModelFacts &f, const PlanRequest &r, const Hardware &h) {
  Plan plan = rankLayouts(f, r, h);
  const int64_t globalBatch = plan.request.globalBatch;
  const double memory = r.gpuMemoryBytes > 0 ? r.gpuMemoryBytes : h.memoryBytes;
  if (plan.chosen == 0) {
    const Candidate &best = plan.candidates.front();
    for (Candidate &c : plan.candidates) {
      if (&c == &best) {
        c.verdict = "chosen: the fastest layout that fits";
        continue;
      }
      if (!c.fits) {
        c.verdict = "does not fit: needs " + gib(c.memory.total()) + ", more than " +
                    gib(memory * (1.0 - kMemoryHeadroom)) + " (90 % of the GPU)";
        continue;
      }
      // The part of the step that grew most against the chosen layout.
      const TimeEstimate &a = c.time, &b = best.time;
      std::vector<std::pair<double, std::string>> parts = {
          {a.compute - b.compute, "compute"},
          {a.expertAllToAll - b.expertAllToAll, "expert all-to-all"},
          {a.tensorParallel - b.tensorParallel, "TP all-reduces"},
          {a.contextParallel - b.contextParallel, "CP exchanges"},
          {a.dataParallel - b.dataParallel, "gradient reduction"},
          {a.bubble - b.bubble, "pipeline bubble"}};
      auto worst = *std::max_element(parts.begin(), parts.end());
      std::ostringstream s;
      s.setf(std::ios::fixed);
      s.precision(0);
      const double slower = 100.0 * (1.0 - c.tokensPerSecond / best.tokensPerSecond);
      if (slower < 1.0)
        s << "within 1 % of the chosen; the recipe prefers no recomputation, fewer stages, less CP, TP before DP";
      else
        s << slower << " % slower: more " << worst.second;
      c.verdict = s.str();
    }
    return plan;
  }
  // Nothing fits: say what is too big, and what would fit.
  if (plan.candidates.empty()) {
    plan.refusal = "no layout satisfies the rules for " + std::to_string(r.gpus) +
                   " GPUs and a global batch of " + std::to_string(globalBatch) + " sequences";
    plan.suggestions.push_back("a global batch that the data ranks divide (e.g. a multiple of the GPU count)");
    return plan;
  }
  const Candidate &least = plan.candidates.front();
  const MemoryEstimate &lm = least.memory;
  std::vector<std::pair<double, std::string>> parts = {
      {lm.weights, "frozen weights"}, {lm.experts, "routed experts' weights"}, {lm.adapters, "adapters"},
      {lm.optimizer, "optimizer state"}, {lm.activations, "activations"}, {lm.buffers, "buffers"}};
  auto largest = *std::max_element(parts.begin(), parts.end());
  plan.refusal = "Nothing fits in " + gib(memory * (1.0 - kMemoryHeadroom)) + " per GPU (90 % of " + gib(memory) +
                 "): the smallest (" + least.layout.text() + ") needs " +
                 gib(lm.total()) + ", most of it " + largest.second + " (" + gib(largest.first) + ")";
  for (int64_t more = r.gpus * 2; more <= r.gpus * 64; more *= 2) {
    PlanRequest bigger = r;
    bigger.gpus = more;
    bigger.globalBatch = r.globalBatch > 0 ? std::max(r.globalBatch, 2 * more) : 0;
    Plan p = rankLayouts(f, bigger, h);
    if (p.chosen >= 0) {
      plan.suggestions.push_back(std::to_string(more) + " GPUs: " + p.candidates[0].layout.text() + " needs " +
                                 gib(p.candidates[0].memory.total()) + " per GPU");
      break;
    }
  }
  if (!r.fp8Weights) {
    PlanRequest fp8 = r;
    fp8.fp8Weights = true;
    Plan p = rankLayouts(f, fp8, h);
    plan.suggestions.push_back(p.chosen >= 0 ? "FP8 frozen weights (--dtype fp8): " + p.candidates[0].layout.text() +
                                                   " fits in " + gib(p.candidates[0].memory.total())
                                             : "FP8 frozen weights alone do not fit either");
  }
  if (r.seqLen > 1024) {
    PlanRequest shorter = r;
    shorter.seqLen = r.seqLen / 4;
    Plan p = rankLayouts(f, shorter, h);
    if (p.chosen >= 0)
      plan.suggestions.push_back("sequences of " + std::to_string(shorter.seqLen) + " tokens: " +
                                 p.candidates[0].layout.text() + " fits");
  }
  return plan;
}

} // namespace adapt::plan
