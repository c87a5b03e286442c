//===- LightningLayer.cpp - MiniMax lightning attention module ------------===//

#include "runtime/LightningLayer.h"

#include "runtime/Errors.h"
#include "runtime/Lightning.h"

namespace adapt::rt {

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
  // Context parallelism: from the previous part's state, this part's passed on.
  torch::Tensor entering, leaving, token;
  if (context.split())
    entering = stateFromPrevious(k, {batch, heads, dim, dim}, k.options().dtype(torch::kFloat32), context,
                                 static_cast<int>(layerIndex));
  torch::Tensor out = lightningAttentionBlocked(q, k, v, slopes, def.chunkSize, entering,
                                                context.split() ? &leaving : nullptr);
  if (context.split())
    token = passStateOn(leaving, context, static_cast<int>(layerIndex));
  out = out.transpose(1, 2).reshape({batch, seqLen, heads * dim});
  out = tensorGroup ? splitWidthRmsNorm(out, norm, def.outputNormEps, /*zeroCentred=*/false, *tensorGroup)
                    : rmsNorm(out, norm, def.outputNormEps);
  out = torch::sigmoid(outputGate.forward(x, training)) * out;
  out = outProj.forward(out, training);
  return token.defined() ? out + token : out;
}

} // namespace adapt::rt
