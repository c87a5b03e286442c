//===- ModelCost.cpp - forward FLOPs of a model's parts -------------------===//

#include "runtime/ModelCost.h"

#include <algorithm>
#include <limits>

namespace adapt::rt {

namespace {

/// The MLP a token meets: its top-k routed experts, the router and the
/// shared experts, or the dense MLP.
double ffnFlopsPerToken(const ModelDef &d, const FfnDef &f) {
  return 2.0 * (f.experts > 0 ? 3.0 * d.hidden * f.intermediate * f.topK + d.hidden * f.experts +
                                    3.0 * d.hidden * f.sharedIntermediate
                              : 3.0 * d.hidden * f.intermediate);
}

/// The token mixer: projections plus the work over the sequence.
double mixerFlopsPerToken(const ModelDef &d, const AttentionDef &a, int64_t seqLen) {
  if (a.kind == AttentionKind::GatedDeltaNet) {
    // Projections, plus per value head the chunked rule's state reads and
    // writes (~4 dk dv) and its intra-chunk matrices (~2 C (dk + dv)).
    const LinearAttentionDef &g = a.linear;
    const double keyDim = g.keyHeads * g.keyHeadDim, valueDim = g.valueHeads * g.valueHeadDim;
    return 2.0 * d.hidden * (2 * keyDim + 2 * valueDim + 2 * g.valueHeads + valueDim) +
           2.0 * g.valueHeads * (4.0 * g.keyHeadDim * g.valueHeadDim +
                                 2.0 * g.chunkSize * (g.keyHeadDim + g.valueHeadDim));
  }
  if (a.kind == AttentionKind::Lightning || a.kind == AttentionKind::KimiDelta) {
    // Five projections of the heads' width; per head the state read and
    // update (~4 d^2) and the intra-block products (~2 b d, b the block).
    const LinearAttentionDef &g = a.linear;
    const double width = g.keyHeads * g.keyHeadDim;
    return 2.0 * d.hidden * 5.0 * width +
           2.0 * g.keyHeads * (4.0 * g.keyHeadDim * g.keyHeadDim +
                               2.0 * std::min<double>(g.chunkSize, seqLen) * g.keyHeadDim);
  }
  double proj;
  if (a.kind == AttentionKind::Mla || a.kind == AttentionKind::SparseMla) {
    double qHead = a.qkNopeDim + a.qkRopeDim;
    double q = a.qLoraRank > 0 ? a.qLoraRank * (d.hidden + a.heads * qHead) : d.hidden * a.heads * qHead;
    proj = q + d.hidden * (a.kvLoraRank + a.qkRopeDim) + a.kvLoraRank * a.heads * (a.qkNopeDim + a.vHeadDim) +
           a.heads * a.vHeadDim * d.hidden;
  } else {
    proj = d.hidden * (a.heads * a.headDim + a.kvHeads * (a.headDim + a.vHeadDim)) + a.heads * a.vHeadDim * d.hidden;
  }
  double span = seqLen / 2.0;
  if (a.slidingWindow > 0)
    span = std::min<double>(span, a.slidingWindow);
  if (a.chunkSize > 0)
    span = std::min<double>(span, a.chunkSize / 2.0);
  if (a.kind == AttentionKind::SparseMla) // top-k keys, plus the indexer's scores over seqLen / 2
    span = std::min<double>(span, a.indexer.topK) +
           a.indexer.heads * a.indexer.headDim * (seqLen / 2.0) / (a.heads * (a.headDim + a.vHeadDim));
  return 2.0 * proj + 2.0 * a.heads * (a.headDim + a.vHeadDim) * span;
}

} // namespace

double layerFlopsPerToken(const ModelDef &def, const LayerDef &layer, int64_t seqLen) {
  return mixerFlopsPerToken(def, layer.attention, seqLen) + ffnFlopsPerToken(def, layer.ffn);
}

double headFlopsPerToken(const ModelDef &def) { return 2.0 * def.vocab * def.hidden; }

std::vector<int64_t> pipelineBoundaries(const ModelDef &def, int64_t pp, int64_t seqLen) {
  const int64_t n = static_cast<int64_t>(def.layers.size());
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + layerFlopsPerToken(def, def.layers[i], seqLen);
  const double head = headFlopsPerToken(def);
  // best[s][j]: the least possible cost of the dearest stage when stages
  // 0..s-1 run layers [0, j); from[s][j] the start of stage s-1 there.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> from(pp + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (int64_t s = 1; s <= pp; ++s)
    for (int64_t j = s; j <= n; ++j)
      for (int64_t i = s - 1; i < j; ++i) {
        double stage = prefix[j] - prefix[i] + (s == pp && j == n ? head : 0.0);
        double cost = std::max(best[s - 1][i], stage);
        if (cost < best[s][j]) { // Strict: ties keep the earlier split.
          best[s][j] = cost;
          from[s][j] = i;
        }
      }
  std::vector<int64_t> bounds(pp + 1, n);
  for (int64_t s = pp; s > 0; --s)
    bounds[s - 1] = from[s][bounds[s]];
  return bounds;
}

} // namespace adapt::rt
