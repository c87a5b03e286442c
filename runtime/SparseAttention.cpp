//===- SparseAttention.cpp - DeepSeek sparse attention (DSA) --------------===//
//
// The attention over selected keys is one autograd Function: the forward
// keeps only its output and the per-row log-sum-exp, and the backward
// recomputes each query block's gathered keys and probabilities, scattering
// key/value gradients into one accumulator. Nothing of size T * k * D stays
// alive between blocks.
//
//===----------------------------------------------------------------------===//

#include "runtime/SparseAttention.h"

#include "runtime/Errors.h"
#include "runtime/KernelLedger.h"
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/FusedIndexerKernel.h"
#include "runtime/cuda/IndexerKernel.h"
#include "runtime/cuda/SparseMlaKernel.h"
#include "runtime/cuda/SparseScatterKernel.h"
#endif

#include <cmath>
#include <limits>
#include <string>

namespace adapt::rt {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string sizesText(const torch::Tensor &t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

} // namespace

namespace {

#ifdef ADAPT_WITH_CUDA_KERNELS
/// lightningTopK on the GPU in bf16, per query block. Where
/// cuda::fusedIndexerTakes the shapes (16, 32 or 64 heads of 32, 64 or 128,
/// the released indexers' among them), one kernel scores the block's queries
/// against the keys up to its last query (causality halves the work) with the
/// per-head products in fp32 on tensor cores, and the block is as many queries as a [block, keys] fp32
/// score tile within the bytes of \p tileBudget bf16 elements holds.
/// Otherwise one bf16 GEMM writes the per-head scores, rounded to bf16 once
/// (relative 2^-8, so near-tied keys may be chosen otherwise than in fp32),
/// cuda::indexerScores reduces them (relu, head weights with the scale folded
/// in, mask), and the block is as many queries as a [block, H, keys] bf16
/// tile within \p tileBudget holds. Either way memory grows with T, never
/// T * T, and top-k follows per block.
SparseSelection lightningTopKBf16(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &headWeights,
                                  double scale, int64_t keep, int64_t tileBudget, int64_t queryOffset) {
  const int64_t batch = q.size(0), heads = q.size(1), seqLen = q.size(2), dim = q.size(3), keyLen = k.size(1);
  bool fused = true;
  for (int64_t b = 0; b < batch; ++b)
    fused = fused && cuda::fusedIndexerTakes(q[b].transpose(0, 1), k[b]);
  fused = chooseKernel("lightning_indexer.fused", q, true, fused);
  const int64_t tile = fused ? 2 * keyLen : heads * keyLen; // Elements of bf16 size per query.
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>({seqLen, 65535, tileBudget / tile}));
  // relu(scale * s) = scale * relu(s) for scale > 0: the scale joins the weights.
  torch::Tensor weights = headWeights.to(torch::kFloat32) * scale;
  torch::Tensor positions = torch::arange(queryOffset, queryOffset + seqLen,
                                          torch::TensorOptions().dtype(torch::kInt64).device(q.device()));
  std::vector<torch::Tensor> perBatch;
  for (int64_t b = 0; b < batch; ++b) {
    torch::Tensor qt = q[b].transpose(0, 1); // [T, H, D]
    std::vector<torch::Tensor> parts;
    for (int64_t start = 0; start < seqLen; start += block) {
      const int64_t n = std::min(block, seqLen - start);
      // Keys up to the block's last query, at least `keep` of them (the later
      // ones masked) so every block gives `keep` slots.
      const int64_t keys = std::min(keyLen, std::max(queryOffset + start + n, keep));
      torch::Tensor blockWeights = weights[b].narrow(0, start, n).contiguous();
      torch::Tensor index;
      if (fused) {
        index = cuda::fusedIndexerScores(qt.narrow(0, start, n), k[b].narrow(0, 0, keys), blockWeights,
                                         queryOffset + start);
      } else {
        torch::Tensor headScores =
            torch::matmul(qt.narrow(0, start, n).reshape({n * heads, dim}), k[b].narrow(0, 0, keys).t())
                .view({n, heads, keys});
        index = cuda::indexerScores(headScores, blockWeights, queryOffset + start);
      }
      parts.push_back(std::get<1>(index.topk(keep, -1)));
    }
    perBatch.push_back(torch::cat(parts, 0));
  }
  SparseSelection s;
  s.indices = torch::stack(perBatch);
  s.valid = s.indices <= positions.view({1, seqLen, 1});
  return s;
}
#endif

} // namespace

SparseSelection lightningTopK(const torch::Tensor &q, const torch::Tensor &k,
                              const torch::Tensor &headWeights, double scale, int64_t topK,
                              int64_t queryBlock, int64_t tileBudget, int64_t queryOffset) {
  torch::NoGradGuard noGrad;
  if (q.dim() != 4 || k.dim() != 3 || headWeights.dim() != 3 || k.size(0) != q.size(0) ||
      k.size(1) < q.size(2) + queryOffset || k.size(2) != q.size(3) || headWeights.size(0) != q.size(0) ||
      headWeights.size(1) != q.size(2) || headWeights.size(2) != q.size(1))
    throw badInput("", "lightning indexer",
                   "expected q [B, H, T, D], k [B, T, D], weights [B, T, H]; found q " + sizesText(q) +
                       ", k " + sizesText(k) + ", weights " + sizesText(headWeights));
  if (topK < 1)
    throw badInput("", "lightning indexer", "expected top_k >= 1, found " + std::to_string(topK));
  const int64_t heads = q.size(1), seqLen = q.size(2), keyLen = k.size(1);
  // Fewer slots than a whole-sequence run only when every visible key fits.
  const int64_t keep = std::min(topK, keyLen);
  const int64_t block =
      std::max<int64_t>(1, std::min(std::max<int64_t>(queryBlock, 1), tileBudget / std::max<int64_t>(1, heads * keyLen)));
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (q.is_cuda() && chooseKernel("lightning_indexer.bf16", q, true,
                                  q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
                                      heads <= 256))
    return lightningTopKBf16(q, k, headWeights, scale, keep, tileBudget, queryOffset);
#endif
  // As transformers: q [B, S, H, D] @ k^T [B, 1, D, T] in fp32, scaled, relu,
  // then the per-head weights [B, S, 1, H] @ [B, S, H, T].
  torch::Tensor keysT = k.to(torch::kFloat32).transpose(1, 2).unsqueeze(1);
  torch::Tensor weights = headWeights.to(torch::kFloat32);
  torch::Tensor keyPositions = torch::arange(keyLen, torch::TensorOptions().dtype(torch::kInt64).device(q.device()));
  torch::Tensor positions = keyPositions.narrow(0, queryOffset, seqLen); // The queries'.
  std::vector<torch::Tensor> parts;
  for (int64_t start = 0; start < seqLen; start += block) {
    const int64_t n = std::min(block, seqLen - start);
    torch::Tensor qb = q.narrow(2, start, n).transpose(1, 2).to(torch::kFloat32).contiguous();
    torch::Tensor scores = torch::relu(torch::matmul(qb, keysT) * scale);
    torch::Tensor index = torch::matmul(weights.narrow(1, start, n).unsqueeze(-2), scores).squeeze(-2);
    torch::Tensor future = keyPositions.view({1, keyLen}) > positions.narrow(0, start, n).view({n, 1});
    index = index.masked_fill(future, kNegInf);
    parts.push_back(std::get<1>(index.topk(keep, -1)));
  }
  SparseSelection s;
  s.indices = torch::cat(parts, 1);
  s.valid = s.indices <= positions.view({1, seqLen, 1});
  return s;
}

namespace {

/// One query block's gathered keys and values and its fp32 logits.
struct GatheredBlock {
  torch::Tensor rows;   ///< [B*n*k'] flat key rows of [B*T].
  torch::Tensor query;  ///< [B, n, KV, G, Dq]
  torch::Tensor keys;   ///< [B, n, KV, k', Dq]
  torch::Tensor values; ///< [B, n, KV, k', Dv]
  torch::Tensor logits; ///< [B, n, KV, G, k'] fp32, -inf where invalid.
};

/// Shapes shared by forward and backward.
struct SparseShapes {
  int64_t batch, heads, seqLen, qkDim, kvHeads, vDim, groups, keep;
  int64_t keyLen; ///< Keys per sequence (more than seqLen for a context-parallel part).
  /// The values are the keys' first vDim columns (MLA's latents): gathered
  /// once, and their gradient joins the keys' before the scatter.
  bool valuesInKeys = false;
};

/// \p q [B, T, H, Dq], \p keys [B*T, KV, Dq], \p values [B*T, KV, Dv].
GatheredBlock gatherBlock(const SparseShapes &s, const torch::Tensor &q, const torch::Tensor &keys,
                          const torch::Tensor &values, const torch::Tensor &indices, const torch::Tensor &valid,
                          double scale, int64_t start, int64_t n) {
  GatheredBlock b;
  torch::Tensor offsets =
      (torch::arange(s.batch, torch::TensorOptions().dtype(torch::kInt64).device(indices.device())) * s.keyLen)
          .view({s.batch, 1, 1});
  // An invalid slot may name a later key than the gathered ones (context
  // parallelism stops the keys at the last query): it is masked, any row does.
  b.rows = (indices.narrow(1, start, n).clamp_max(s.keyLen - 1) + offsets).reshape({-1});
  b.keys = keys.index_select(0, b.rows).view({s.batch, n, s.keep, s.kvHeads, s.qkDim}).permute({0, 1, 3, 2, 4});
  b.values = s.valuesInKeys ? b.keys.narrow(-1, 0, s.vDim)
                            : values.index_select(0, b.rows)
                                  .view({s.batch, n, s.keep, s.kvHeads, s.vDim})
                                  .permute({0, 1, 3, 2, 4});
  b.query = q.narrow(1, start, n).reshape({s.batch, n, s.kvHeads, s.groups, s.qkDim});
  torch::Tensor logits = torch::matmul(b.query, b.keys.transpose(-1, -2)) * scale;
  torch::Tensor hidden = valid.narrow(1, start, n).logical_not().view({s.batch, n, 1, 1, s.keep});
  b.logits = logits.to(torch::kFloat32).masked_fill(hidden, kNegInf);
  return b;
}

/// The shapes of q [B, H, T, Dq], k [B, KV, S, Dq] and v [B, KV, S, Dv]
/// (unused where \p valueDim > 0: the values are k's first valueDim columns).
SparseShapes shapesOf(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                      const torch::Tensor &indices, int64_t valueDim) {
  const bool inKeys = valueDim > 0;
  return {q.size(0),       q.size(1),      q.size(2), q.size(3), k.size(1), inKeys ? valueDim : v.size(3),
          q.size(1) / k.size(1), indices.size(2), k.size(2), inKeys};
}

#ifdef ADAPT_WITH_CUDA_KERNELS
/// The latent rows [B*S, Dq] when cuda::sparseLatentForward and its backward
/// take this attention (MLA's latents at the released widths, bf16 on the
/// GPU), else undefined. Forward and backward ask here, so they agree.
torch::Tensor latentKernelRows(const SparseShapes &s, const torch::Tensor &qt, const torch::Tensor &keys) {
  const bool latent = s.valuesInKeys && s.kvHeads == 1;
  torch::Tensor rows = latent ? keys.view({s.batch * s.keyLen, s.qkDim}) : torch::Tensor();
  return chooseKernel("sparse_mla.latent", qt, true, latent && cuda::sparseLatentForwardTakes(qt, rows, s.vDim))
             ? rows
             : torch::Tensor();
}
#endif

/// The attention as one autograd node (see the file comment).
struct SparseAttentionFunction : torch::autograd::Function<SparseAttentionFunction> {
  /// \p valueDim > 0: the values are the first valueDim columns of \p k
  /// (\p v is then an empty placeholder: a Function's inputs must be defined).
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &q,
                               const torch::Tensor &k, const torch::Tensor &v, const torch::Tensor &indices,
                               const torch::Tensor &valid, double scale, int64_t block, int64_t valueDim) {
    SparseShapes s = shapesOf(q, k, v, indices, valueDim);
    torch::Tensor qt = q.transpose(1, 2).contiguous();
    torch::Tensor keys = k.transpose(1, 2).reshape({s.batch * s.keyLen, s.kvHeads, s.qkDim});
    torch::Tensor values = s.valuesInKeys ? torch::Tensor()
                                          : v.transpose(1, 2).reshape({s.batch * s.keyLen, s.kvHeads, s.vDim});
    torch::Tensor out = torch::empty({s.batch, s.seqLen, s.heads, s.vDim}, q.options());
    torch::Tensor lse = torch::empty({s.batch, s.seqLen, s.heads}, q.options().dtype(torch::kFloat32));
    bool done = false;
#ifdef ADAPT_WITH_CUDA_KERNELS
    // One kernel gathers the selected rows into shared memory; the backward
    // recomputes the same rounded logits from the same rows.
    if (torch::Tensor rows = latentKernelRows(s, qt, keys); rows.defined()) {
      cuda::sparseLatentForward(qt, rows, indices, valid, scale, s.keyLen, s.vDim, out, lse);
      done = true;
    }
#endif
    for (int64_t start = 0; start < s.seqLen && !done; start += block) {
      const int64_t n = std::min(block, s.seqLen - start);
      GatheredBlock b = gatherBlock(s, qt, keys, values, indices, valid, scale, start, n);
      torch::Tensor rowLse = torch::logsumexp(b.logits, -1, /*keepdim=*/true);
      torch::Tensor probs = torch::exp(b.logits - rowLse).to(q.scalar_type());
      out.narrow(1, start, n).copy_(torch::matmul(probs, b.values).reshape({s.batch, n, s.heads, s.vDim}));
      lse.narrow(1, start, n).copy_(rowLse.reshape({s.batch, n, s.heads}));
    }
    ctx->save_for_backward({q, k, v, indices, valid, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block"] = block;
    ctx->saved_data["valueDim"] = valueDim;
    return out; // [B, T, H, Dv]
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &indices = saved[3], &valid = saved[4];
    const torch::Tensor &out = saved[5], &lse = saved[6];
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t block = ctx->saved_data["block"].toInt();
    const int64_t valueDim = ctx->saved_data["valueDim"].toInt();
    SparseShapes s = shapesOf(q, k, v, indices, valueDim);
    torch::Tensor qt = q.transpose(1, 2).contiguous();
    torch::Tensor keys = k.transpose(1, 2).reshape({s.batch * s.keyLen, s.kvHeads, s.qkDim});
    torch::Tensor values = s.valuesInKeys ? torch::Tensor()
                                          : v.transpose(1, 2).reshape({s.batch * s.keyLen, s.kvHeads, s.vDim});
    // The GEMMs run in the inputs' dtype (fp32 accumulation), as the
    // reference's autograd does; the softmax algebra and the scattered
    // key/value gradients stay fp32.
    const auto dtype = q.scalar_type();
    torch::Tensor gradOut = grads[0].to(dtype); // [B, T, H, Dv]
    auto f32 = q.options().dtype(torch::kFloat32);
    torch::Tensor dq = torch::empty({s.batch, s.seqLen, s.heads, s.qkDim}, q.options());
    torch::Tensor dk = torch::zeros({s.batch * s.keyLen, s.kvHeads, s.qkDim}, f32);
    torch::Tensor dv = s.valuesInKeys ? torch::Tensor() : torch::zeros({s.batch * s.keyLen, s.kvHeads, s.vDim}, f32);
    bool done = false;
#ifdef ADAPT_WITH_CUDA_KERNELS
    // The forward's kernel path: one kernel for the whole backward (the same
    // rounding as the blocks below, the rows' gradients added with atomics).
    if (torch::Tensor rows = latentKernelRows(s, qt, keys); rows.defined()) {
      torch::Tensor dkRows = dk.view({s.batch * s.keyLen, s.qkDim});
      cuda::sparseLatentBackward(qt, rows, indices, valid, out, gradOut.contiguous(), lse, scale, s.keyLen, dq,
                                 dkRows);
      done = true;
    }
#endif
    for (int64_t start = 0; start < s.seqLen && !done; start += block) {
      const int64_t n = std::min(block, s.seqLen - start);
      GatheredBlock b = gatherBlock(s, qt, keys, values, indices, valid, scale, start, n);
      auto heads5 = [&](const torch::Tensor &t, int64_t dim) {
        return t.narrow(1, start, n).reshape({s.batch, n, s.kvHeads, s.groups, dim});
      };
      torch::Tensor probs = torch::exp(b.logits - heads5(lse, 1));
      torch::Tensor dOut = heads5(gradOut, s.vDim);
      torch::Tensor rowDot =
          (dOut.to(torch::kFloat32) * heads5(out, s.vDim).to(torch::kFloat32)).sum(-1, /*keepdim=*/true);
      torch::Tensor dProbs = torch::matmul(dOut, b.values.transpose(-1, -2)).to(torch::kFloat32);
      torch::Tensor dLogits = (probs * (dProbs - rowDot) * scale).to(dtype); // [B, n, KV, G, k']
      dq.narrow(1, start, n).copy_(torch::matmul(dLogits, b.keys).reshape({s.batch, n, s.heads, s.qkDim}));
      torch::Tensor dKeys = torch::matmul(dLogits.transpose(-1, -2), b.query); // [B, n, KV, k', Dq]
      torch::Tensor dValues = torch::matmul(probs.to(dtype).transpose(-1, -2), dOut);
#ifdef ADAPT_WITH_CUDA_KERNELS
      // One KV head (MLA): the rows are in b.rows' order; one pass per
      // accumulator reads them in bf16 and adds them with 16-byte atomics.
      // (Widths of whole 4-element groups, checked first: both scatters run or neither.)
      if (s.kvHeads == 1 && dk.is_cuda() && s.qkDim % 4 == 0 && s.vDim % 4 == 0) {
        torch::Tensor dkRows = dk.view({-1, s.qkDim});
        torch::Tensor keyRows = dKeys.reshape({-1, s.qkDim}), valueRows = dValues.reshape({-1, s.vDim});
        torch::Tensor dvRows = s.valuesInKeys ? torch::Tensor() : dv.view({-1, s.vDim});
        const bool scattered = s.valuesInKeys
                                   ? cuda::scatterAddKeyGradients(dkRows, b.rows, keyRows, valueRows)
                                   : cuda::scatterAddKeyGradients(dkRows, b.rows, keyRows, torch::Tensor()) &&
                                         cuda::scatterAddKeyGradients(dvRows, b.rows, valueRows, torch::Tensor());
        if (scattered)
          continue;
      }
#endif
      dKeys = dKeys.to(torch::kFloat32);
      if (s.valuesInKeys)
        dKeys.narrow(-1, 0, s.vDim).add_(dValues);
      dk.index_add_(0, b.rows, dKeys.permute({0, 1, 3, 2, 4}).reshape({-1, s.kvHeads, s.qkDim}));
      if (!s.valuesInKeys)
        dv.index_add_(0, b.rows,
                      dValues.to(torch::kFloat32).permute({0, 1, 3, 2, 4}).reshape({-1, s.kvHeads, s.vDim}));
    }
    auto back = [&](const torch::Tensor &g, const torch::Tensor &like) {
      return g.view({s.batch, s.keyLen, like.size(1), like.size(3)}).transpose(1, 2).to(like.scalar_type());
    };
    // With the values inside the keys, their gradient is already in dk.
    return {dq.transpose(1, 2), back(dk, k), s.valuesInKeys ? torch::Tensor() : back(dv, v), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

namespace {

/// sparseAttention and sparseLatentAttention: \p v [B, KV, S, Dv], or, with
/// \p valueDim > 0, the values are \p k's first valueDim columns.
torch::Tensor attendSelected(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                             int64_t valueDim, const SparseSelection &selection, double scale, int64_t queryBlock) {
  const torch::Tensor &idx = selection.indices;
  const bool inKeys = valueDim > 0;
  bool ok = q.dim() == 4 && k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 &&
            k.size(2) >= q.size(2) && k.size(3) == q.size(3) && idx.dim() == 3 && idx.size(0) == q.size(0) &&
            idx.size(1) == q.size(2) && selection.valid.sizes() == idx.sizes() &&
            (inKeys ? valueDim <= k.size(3)
                    : v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2));
  if (!ok)
    throw badInput("", "sparse attention",
                   "expected q [B, H, T, Dq], k [B, KV, S, Dq], v [B, KV, S, Dv] (S >= T), indices [B, T, k]; found q " +
                       sizesText(q) + ", k " + sizesText(k) + (inKeys ? "" : ", v " + sizesText(v)) + ", indices " +
                       sizesText(idx));
  return SparseAttentionFunction::apply(q, k, inKeys ? torch::empty({0}, k.options()) : v, idx.to(torch::kInt64),
                                        selection.valid.to(torch::kBool), scale, std::max<int64_t>(1, queryBlock),
                                        inKeys ? valueDim : int64_t(0))
      .transpose(1, 2);
}

} // namespace

torch::Tensor sparseAttention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                              const SparseSelection &selection, double scale, int64_t queryBlock) {
  return attendSelected(q, k, v, 0, selection, scale, queryBlock);
}

torch::Tensor sparseLatentAttention(const torch::Tensor &q, const torch::Tensor &latents, int64_t valueDim,
                                    const SparseSelection &selection, double scale, int64_t queryBlock) {
  if (valueDim <= 0)
    throw badInput("", "sparse attention", "expected a value width > 0, found " + std::to_string(valueDim));
  return attendSelected(q, latents, torch::Tensor(), valueDim, selection, scale, queryBlock);
}

RopeTables relayoutRope(const RopeTables &tables, bool fromInterleaved, bool toInterleaved) {
  if (fromInterleaved == toInterleaved || !tables.cos.defined())
    return tables;
  auto convert = [&](const torch::Tensor &t) {
    const int64_t half = t.size(-1) / 2;
    if (fromInterleaved) { // [f0, f0, f1, f1, ...] -> [f0, f1, ..., f0, f1, ...]
      torch::Tensor freqs = t.unflatten(-1, {half, 2}).select(-1, 0);
      return torch::cat({freqs, freqs}, -1);
    }
    return t.narrow(-1, 0, half).repeat_interleave(2, -1);
  };
  return {convert(tables.cos), convert(tables.sin)};
}

namespace {

/// The indexer's top-k for one layer: frozen, no gradient (transformers runs
/// it under no_grad). \p qResid is q_a_layernorm(q_a_proj(x)).
SparseSelection indexerSelection(const AttentionLayer &a, const torch::Tensor &x, const torch::Tensor &qResid,
                                 const RopeTables &rope, bool training) {
  torch::NoGradGuard noGrad;
  const SparseIndexerDef &ix = a.def.indexer;
  const int64_t batch = x.size(0), seqLen = x.size(1);
  RopeTables tables = relayoutRope(rope, a.def.rope.interleaved, ix.ropeInterleaved);
  torch::Tensor q = a.indexQ.forward(qResid.detach(), training)
                        .view({batch, seqLen, ix.heads, ix.headDim})
                        .transpose(1, 2);
  q = applyRope(q, tables, ix.ropeInterleaved);
  torch::Tensor k = torch::layer_norm(a.indexK.forward(x.detach(), training), {ix.headDim}, a.indexKNorm,
                                      a.indexKNormBias, ix.keyNormEps);
  k = applyRope(k.unsqueeze(1), tables, ix.ropeInterleaved).squeeze(1);
  // weights_proj stays fp32 in transformers (_keep_in_fp32_modules).
  torch::Tensor w = a.indexWeights.forward(x.detach().to(a.indexWeights.weight.scalar_type()), training)
                        .to(torch::kFloat32) *
                    std::pow(static_cast<double>(ix.heads), -0.5);
  // One fp32 score tile of at most 2^28 elements (1 GiB) on a GPU, 2^26 elsewhere.
  const int64_t tileBudget = int64_t(1) << (q.is_cuda() ? 28 : 26);
  // Context parallelism: the keys of the whole sequence (the later ones
  // masked), so each query's scores form the same row as in one process and
  // top-k breaks ties among equal scores (relu leaves many zeros) alike.
  k = gatherAll(k, 1, a.context);
  return lightningTopK(q, k, w, std::pow(static_cast<double>(ix.headDim), -0.5), ix.topK, ix.queryBlock,
                       tileBudget, a.context.offset(seqLen));
}

/// A selection given from outside (AttentionLayer::forcedSelection): the
/// same keys, visible where the position is at most the query's, as
/// transformers masks its own choice with the causal mask.
SparseSelection givenSelection(const torch::Tensor &indices, int64_t batch, int64_t seqLen, int64_t topK) {
  const std::vector<int64_t> expected = {batch, seqLen, std::min(topK, seqLen)};
  if (indices.sizes() != torch::IntArrayRef(expected))
    throw badInput("", "--force-routing",
                   "expected the indexer's selection as [" + std::to_string(expected[0]) + ", " +
                       std::to_string(expected[1]) + ", " + std::to_string(expected[2]) + "] key positions");
  torch::Tensor query = torch::arange(seqLen, indices.options()).view({1, seqLen, 1});
  return {indices, indices <= query};
}

} // namespace

torch::Tensor sparseMlaForward(const AttentionLayer &a, const torch::Tensor &x, const RopeTables &rope,
                               bool training) {
  const AttentionDef &d = a.def;
  if (d.qLoraRank <= 0)
    throw badInput("", "sparse attention", "expected q_lora_rank > 0 (the indexer reads the query latent)");
  const int64_t batch = x.size(0), seqLen = x.size(1), heads = d.heads;
  const int64_t nope = d.qkNopeDim, ropeDim = d.qkRopeDim, rank = d.kvLoraRank, vDim = d.vHeadDim;
  const double latentEps = d.indexer.latentNormEps;
  torch::Tensor qResid = rmsNorm(a.qA.forward(x, training), a.qANorm, latentEps);
  torch::Tensor qs = a.qB.forward(qResid, training).view({batch, seqLen, heads, nope + ropeDim}).transpose(1, 2);
  torch::Tensor qPass = qs.narrow(-1, 0, nope);
  torch::Tensor qRot = applyRope(qs.narrow(-1, nope, ropeDim), rope, d.rope.interleaved);
  torch::Tensor kv = a.kvA.forward(x, training);
  torch::Tensor latent = rmsNorm(kv.narrow(-1, 0, rank), a.kvANorm, latentEps).unsqueeze(1); // [B, 1, T, R]
  torch::Tensor kRot = applyRope(kv.narrow(-1, rank, ropeDim).view({batch, 1, seqLen, ropeDim}), rope,
                                 d.rope.interleaved);
  if (a.tensorGroup) { // Shared by every rank's heads: their gradients are summed.
    latent = copyToTensorRegion(latent, *a.tensorGroup);
    kRot = copyToTensorRegion(kRot, *a.tensorGroup);
  }
  // Context parallelism: every earlier part's latents and rotary keys too.
  latent = gatherEarlier(latent, 2, a.context);
  kRot = gatherEarlier(kRot, 2, a.context);
  SparseSelection selection = a.forcedSelection.defined()
                                  ? givenSelection(a.forcedSelection, batch, seqLen, d.indexer.topK)
                                  : indexerSelection(a, x, qResid, rope, training);

  // kv_b_proj absorbed: keys are the shared latents, queries W_UK^T q_nope,
  // and the output W_UV times the attended latent. LoRA on kv_b_proj joins
  // the weight; with LoRA dropout its path gets its own (dropped) latent.
  const auto dtype = x.scalar_type();
  std::vector<torch::Tensor> latents = {latent}, projections = {a.kvB.weight};
  if (a.kvB.hasLora()) {
    torch::Tensor delta = torch::matmul(a.kvB.loraB.to(dtype), a.kvB.loraA.to(dtype)) * a.kvB.scale;
    if (training && a.kvB.dropout > 0.0) {
      latents.push_back(torch::dropout(latent, a.kvB.dropout, /*train=*/true));
      projections.push_back(delta);
    } else {
      projections[0] = projections[0] + delta;
    }
  }
  std::vector<torch::Tensor> queryParts, keyParts, valueUps;
  for (size_t i = 0; i < latents.size(); ++i) {
    torch::Tensor w = projections[i].view({heads, nope + vDim, rank});
    queryParts.push_back(torch::matmul(qPass, w.narrow(1, 0, nope).unsqueeze(0))); // [B, H, T, R]
    valueUps.push_back(w.narrow(1, nope, vDim).transpose(1, 2).unsqueeze(0));      // [1, H, R, Dv]
  }
  queryParts.push_back(qRot);
  std::vector<torch::Tensor> keyList = latents;
  keyList.push_back(kRot);
  torch::Tensor query = torch::cat(queryParts, -1);
  torch::Tensor key = torch::cat(keyList, -1); // [latents | rotary key]: the values are its first columns
  // On the GPU the attention takes 256-query blocks at least: a block's
  // transients are ~2.5 GB there at top-k 2,048, and fewer blocks leave the
  // GPU less idle between small launches (docs/performance.md).
  const int64_t attentionBlock = x.is_cuda() ? std::max<int64_t>(d.indexer.queryBlock, 256) : d.indexer.queryBlock;
  torch::Tensor attended = sparseLatentAttention(query, key, int64_t(latents.size()) * rank, selection,
                                                 a.softmaxScale(), attentionBlock);
  torch::Tensor out;
  for (size_t i = 0; i < latents.size(); ++i) {
    torch::Tensor part = torch::matmul(attended.narrow(-1, int64_t(i) * rank, rank), valueUps[i]);
    out = out.defined() ? out + part : part;
  }
  out = out.transpose(1, 2).reshape({batch, seqLen, heads * vDim});
  return a.o.forward(out, training);
}

} // namespace adapt::rt
