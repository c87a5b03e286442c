//===- SparseAttention.h - DeepSeek sparse attention (DSA) ------*- C++ -*-===//
//
// DeepSeek-V3.2 / GLM-5 sparse attention: a lightning indexer scores every
// earlier key for each query, the top-k keys are kept, and MLA attends to
// those keys only. Everything runs in query blocks: the indexer holds one
// [block, heads, T] score tile at a time, the attention gathers [block, k]
// keys, so memory grows with T * k, never T * T.
//
// The selection is discrete: it carries no gradient, and the indexer's
// weights stay frozen (transformers runs its indexer under no_grad; the
// indexer's own KL training loss is not implemented). Gradients flow through
// the attention over the selected keys.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_SPARSEATTENTION_H
#define ADAPT_RUNTIME_SPARSEATTENTION_H

#include "runtime/Layers.h"
#include "runtime/Ops.h"

#include <torch/torch.h>

namespace adapt::rt {

/// The keys each query attends to.
struct SparseSelection {
  /// [B, T, k'] int64 key positions, k' = min(topK, T), best first.
  torch::Tensor indices;
  /// [B, T, k'] bool: the key is visible (position <= the query's). Early
  /// queries see fewer than k' keys; their extra slots are invalid.
  torch::Tensor valid;
};

/// The lightning indexer's top-k, as transformers computes it: for query t
/// and key j <= t, score = sum_h w[t, h] * relu(scale * q[t, h] . k[j]); the
/// min(topK, T) best keys of each query (all visible keys when fewer). \p q
/// [B, H, T, D] and \p k [B, T, D] carry RoPE already; \p headWeights
/// [B, T, H] include the 1/sqrt(H) factor. Scores are fp32. No gradient.
/// Queries go in blocks of at most \p queryBlock, fewer when one [block, H, T]
/// tile would pass \p tileBudget elements. Context parallelism: the queries
/// sit at positions \p queryOffset + t and \p k holds the keys of at least
/// every position up to the last query's, [B, S >= queryOffset + T, D].
SparseSelection lightningTopK(const torch::Tensor &q, const torch::Tensor &k,
                              const torch::Tensor &headWeights, double scale, int64_t topK,
                              int64_t queryBlock = 64, int64_t tileBudget = int64_t(1) << 26,
                              int64_t queryOffset = 0);

/// Softmax attention of each query over its selected keys only. \p q
/// [B, H, T, Dq], \p k [B, KV, T, Dq], \p v [B, KV, T, Dv] (H a multiple of
/// KV), \p selection from lightningTopK. Logits in the input dtype, softmax in
/// fp32 (as transformers' eager attention). Keys are gathered per query block
/// ([B, block, k', KV, D]); differentiable in q, k and v. Returns
/// [B, H, T, Dv].
torch::Tensor sparseAttention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                              const SparseSelection &selection, double scale, int64_t queryBlock = 64);

/// sparseAttention where the values are the first \p valueDim columns of the
/// keys \p latents [B, KV, S, Dq] (MLA's absorbed form: the shared latents
/// are both): each block's keys are gathered once, and the values' gradient
/// joins the keys' before one scatter.
torch::Tensor sparseLatentAttention(const torch::Tensor &q, const torch::Tensor &latents, int64_t valueDim,
                                    const SparseSelection &selection, double scale, int64_t queryBlock = 64);

/// \p tables (for \p fromInterleaved) laid out for the other RoPE layout:
/// the indexer of DeepSeek-V3.2 rotates halves while its MLA rotates pairs.
RopeTables relayoutRope(const RopeTables &tables, bool fromInterleaved, bool toInterleaved);

/// The SparseMla layer's forward: MLA projections as AttentionLayer's, the
/// indexer's selection (frozen, no gradient), then attention over the
/// selected keys in MLA's latent space (kv_b_proj absorbed into the query and
/// the output, so the gathered keys are the shared [kv_lora_rank + rope]
/// latents, not per-head keys). \p x [B, T, hidden]; returns [B, T, hidden].
torch::Tensor sparseMlaForward(const AttentionLayer &layer, const torch::Tensor &x,
                               const RopeTables &rope, bool training);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_SPARSEATTENTION_H
