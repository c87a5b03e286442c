//===- LightningLayer.cpp - MiniMax lightning attention module ------------===//

#include "runtime/LightningLayer.h"

#include "runtime/Errors.h"
#include "runtime/Lightning.h"

namespace adapt::rt {

namespace {

/// Under context parallelism: this part's output from the state entering
/// it, without a rank-to-rank chain. Lightning's state decays by a fixed
/// a_h = e^{-s_h} a token, so the state entering part c is the earlier
/// parts' leaving states, each run from zeros (\p leaving, fp32 [B, H, d,
/// d]), decayed over the parts between: E_c = sum_{j<c} a^{T (c-1-j)} L_j
/// (T tokens a part), from one all-gather; token t of the part then sees
/// a^{t+1} q_t E_c: q E_c in q's dtype (E_c rounded to it, as the kernels
/// pass states in bf16; no fp32 copy of q, which at 64 heads x 128K tokens
/// a rank would be 4 GiB), then each row's decay. Differentiable; on rank 0
/// an empty sum (zeros), which keeps the gather, collective in the backward
/// too, in the graph.
torch::Tensor enteringStateOutput(const torch::Tensor &q, const torch::Tensor &leaving, const torch::Tensor &slopes,
                                  const ContextSplit &cp) {
  const torch::Tensor parts = gatherEarlier(leaving.unsqueeze(2), 2, cp); // [B, H, c + 1, d, d]
  const int64_t tokens = q.size(2);
  const torch::Tensor s = slopes.to(q.device(), torch::kFloat32).view({-1, 1});                // [H, 1]
  const torch::Tensor between = torch::arange(cp.rank - 1, -1, -1, s.options()).view({1, -1}); // c-1-j
  const torch::Tensor weights = torch::exp(-s * double(tokens) * between);                   // [H, c]
  const torch::Tensor entering =
      (parts.narrow(2, 0, cp.rank) * weights.view({1, s.size(0), cp.rank, 1, 1})).sum(2); // [B, H, d, d]
  const torch::Tensor position = torch::arange(1, tokens + 1, s.options()).view({1, -1}); // t + 1
  const torch::Tensor rowDecay = torch::exp(-s * position).view({1, -1, tokens, 1});      // [1, H, T, 1]
  return torch::matmul(q, entering.to(q.scalar_type())) * rowDecay.to(q.scalar_type());
}

} // namespace

void LightningLayer::setLayer(int64_t layerIndex) {
  if (def.keyHeads <= 0 || def.keyHeadDim <= 0 || def.valueHeads != def.keyHeads ||
      def.valueHeadDim != def.keyHeadDim || def.decayLayers <= 0 || def.chunkSize <= 0)
    throw RuntimeError("", "layer " + std::to_string(layerIndex) + " lightning attention",
                       "expected equal key/value heads and head dims, a block size and the layer count "
                       "(regenerate with adapt build)");
  slopes = lightningSlopes(def.keyHeads, layerIndex, def.decayLayers);
}

torch::Tensor LightningLayer::forward(const torch::Tensor &x, bool training) const {
  const int64_t batch = x.size(0), seqLen = x.size(1);
  const int64_t heads = def.keyHeads, dim = def.keyHeadDim;
  torch::Tensor qkv = torch::silu(qkvProj.forward(x, training)).view({batch, seqLen, heads, 3 * dim});
  torch::Tensor q = qkv.narrow(-1, 0, dim).transpose(1, 2);
  torch::Tensor k = qkv.narrow(-1, dim, dim).transpose(1, 2);
  torch::Tensor v = qkv.narrow(-1, 2 * dim, dim).transpose(1, 2);
  // Context parallelism: each part from a zero state, all at once, then the
  // entering state's share from the earlier parts' leaving states (no rank
  // waits for the one before it, as the delta rule's layers do).
  torch::Tensor leaving;
  torch::Tensor out = lightningAttentionBlocked(q, k, v, slopes, def.chunkSize, torch::Tensor(),
                                                context.split() ? &leaving : nullptr);
  if (context.split())
    out = out + enteringStateOutput(q, leaving, slopes, context);
  out = out.transpose(1, 2).reshape({batch, seqLen, heads * dim});
  out = tensorGroup ? splitWidthRmsNorm(out, norm, def.outputNormEps, /*zeroCentred=*/false, *tensorGroup)
                    : rmsNorm(out, norm, def.outputNormEps);
  out = torch::sigmoid(outputGate.forward(x, training)) * out;
  out = outProj.forward(out, training);
  return out;
}

} // namespace adapt::rt
