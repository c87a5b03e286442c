//===- SparseMlaLayer.h - a small DeepSeek sparse attention layer -*- C++ -*-===//
//
// The SparseMla layer the runtime-unit tests run: 3 MLA heads (nope 8, rope
// 4, value 6), q and kv latents of 10 and 7, a 2-head indexer of width 8
// keeping 5 keys per query, random frozen weights. Shared by the latent-form
// test (SparseAttentionTest.cpp) and the hybrid block's context-parallel
// test (LinearLayersTest.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TESTS_SPARSEMLALAYER_H
#define ADAPT_RUNTIME_TESTS_SPARSEMLALAYER_H

#include "runtime/Layers.h"

#include <torch/torch.h>

#include <cmath>

namespace adapt::rt::test {

constexpr int64_t kMlaHeads = 3, kMlaNope = 8, kMlaRope = 4, kMlaValue = 6, kMlaQRank = 10, kMlaKvRank = 7;

/// A frozen projection [out, in] without an adapter.
inline LoraLinear frozenLinear(int64_t out, int64_t in) {
  LoraLinear l;
  l.weight = torch::randn({out, in}) / std::sqrt(double(in));
  return l;
}

/// The layer over a residual stream of \p hidden; \p indexerPairs: the
/// indexer rotates pairs (else halves, as DeepSeek-V3.2's does).
inline AttentionLayer sparseMlaLayer(int64_t hidden, bool indexerPairs) {
  AttentionLayer a;
  AttentionDef &d = a.def;
  d.kind = AttentionKind::SparseMla;
  d.heads = d.kvHeads = kMlaHeads;
  d.qkNopeDim = kMlaNope, d.qkRopeDim = kMlaRope, d.headDim = kMlaNope + kMlaRope, d.vHeadDim = kMlaValue;
  d.qLoraRank = kMlaQRank, d.kvLoraRank = kMlaKvRank;
  d.rope.rotaryDim = kMlaRope, d.rope.interleaved = true;
  d.indexer.heads = 2, d.indexer.headDim = 8, d.indexer.topK = 5, d.indexer.queryBlock = 4;
  d.indexer.ropeInterleaved = indexerPairs;
  a.qA = frozenLinear(kMlaQRank, hidden);
  a.qANorm = 1 + 0.1 * torch::randn({kMlaQRank});
  a.qB = frozenLinear(kMlaHeads * (kMlaNope + kMlaRope), kMlaQRank);
  a.kvA = frozenLinear(kMlaKvRank + kMlaRope, hidden);
  a.kvANorm = 1 + 0.1 * torch::randn({kMlaKvRank});
  a.kvB = frozenLinear(kMlaHeads * (kMlaNope + kMlaValue), kMlaKvRank);
  a.o = frozenLinear(hidden, kMlaHeads * kMlaValue);
  a.indexQ = frozenLinear(2 * 8, kMlaQRank);
  a.indexK = frozenLinear(8, hidden);
  a.indexKNorm = 1 + 0.1 * torch::randn({8});
  a.indexKNormBias = 0.1 * torch::randn({8});
  a.indexWeights = frozenLinear(2, hidden);
  return a;
}

} // namespace adapt::rt::test

#endif // ADAPT_RUNTIME_TESTS_SPARSEMLALAYER_H
