//===- Lightning.cpp - MiniMax lightning attention's kernels --------------===//

#include "runtime/Lightning.h"

#include "runtime/Errors.h"

#include <cmath>

namespace adapt::rt {

namespace {

/// Rejects inputs the kernels cannot take, naming what was expected.
void checkInputs(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                 const torch::Tensor &slopes) {
  auto fail = [](const std::string &what) {
    throw RuntimeError("", "lightning attention", what, kExitInternal);
  };
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    fail("expected q, k, v as [batch, heads, tokens, dim]");
  if (k.sizes() != q.sizes())
    fail("expected k shaped like q");
  if (v.size(0) != q.size(0) || v.size(1) != q.size(1) || v.size(2) != q.size(2))
    fail("expected v with q's batch, heads and tokens");
  if (slopes.dim() != 1 || slopes.size(0) != q.size(1))
    fail("expected one decay slope per head (" + std::to_string(q.size(1)) + ")");
}

/// slopes [H] as fp32 [1, H, 1, 1] on \p device.
torch::Tensor perHead(const torch::Tensor &slopes, const torch::Device &device) {
  return slopes.to(device, torch::kFloat32).view({1, -1, 1, 1});
}

} // namespace

torch::Tensor lightningSlopes(int64_t heads, int64_t layerIndex, int64_t numLayers) {
  if (heads <= 0 || numLayers <= 0 || layerIndex < 0 || layerIndex >= numLayers)
    throw RuntimeError("", "lightning attention slopes",
                       "expected heads > 0 and 0 <= layer < layers, found heads " + std::to_string(heads) +
                           ", layer " + std::to_string(layerIndex) + " of " + std::to_string(numLayers),
                       kExitInternal);
  const double base = 1.0 / std::pow(2.0, 8.0 / double(heads));
  const double factor = 1.0 - double(layerIndex) / (double(numLayers) - 1.0 + 1e-5) + 1e-5;
  torch::Tensor out = torch::empty({heads}, torch::kFloat32);
  auto acc = out.accessor<float, 1>();
  for (int64_t h = 0; h < heads; ++h) {
    // transformers rounds base^(h+1) to fp32 before the layer factor.
    float rate = static_cast<float>(std::pow(base, double(h + 1)));
    acc[h] = static_cast<float>(double(rate) * factor);
  }
  return out;
}

torch::Tensor lightningAttentionRecurrent(const torch::Tensor &q, const torch::Tensor &k,
                                          const torch::Tensor &v, const torch::Tensor &slopes) {
  checkInputs(q, k, v, slopes);
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2);
  torch::Tensor qf = q.to(torch::kFloat32), kf = k.to(torch::kFloat32), vf = v.to(torch::kFloat32);
  torch::Tensor decay = torch::exp(-perHead(slopes, q.device()));
  torch::Tensor state = torch::zeros({batch, heads, q.size(3), v.size(3)}, qf.options());
  std::vector<torch::Tensor> outputs;
  outputs.reserve(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    torch::Tensor kt = kf.select(2, t).unsqueeze(-1), vt = vf.select(2, t).unsqueeze(-2);
    state = decay * state + kt * vt;
    outputs.push_back(torch::matmul(qf.select(2, t).unsqueeze(-2), state).squeeze(-2));
  }
  if (outputs.empty())
    return torch::zeros({batch, heads, 0, v.size(3)}, q.options());
  return torch::stack(outputs, 2).to(q.scalar_type());
}

torch::Tensor lightningAttentionBlocked(const torch::Tensor &q, const torch::Tensor &k,
                                        const torch::Tensor &v, const torch::Tensor &slopes,
                                        int64_t blockSize, const torch::Tensor &initialState,
                                        torch::Tensor *finalState) {
  checkInputs(q, k, v, slopes);
  if (blockSize <= 0)
    throw RuntimeError("", "lightning attention", "expected block_size > 0, found " + std::to_string(blockSize),
                       kExitInternal);
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2);
  const int64_t dk = q.size(3), dv = v.size(3);
  if (tokens == 0) {
    if (finalState)
      *finalState = initialState;
    return torch::zeros({batch, heads, 0, dv}, q.options());
  }
  // A sequence shorter than a block is one (short) block, as in transformers.
  const int64_t block = std::min(blockSize, tokens);
  const int64_t blocks = (tokens + block - 1) / block, padded = blocks * block;
  auto prepare = [&](const torch::Tensor &x) {
    torch::Tensor f = x.to(torch::kFloat32);
    // Zero tokens past the end: as keys and values they add nothing, and
    // their query rows are dropped. The decays of a short last block are
    // the prefixes of a full block's, so its outputs are unchanged.
    if (padded > tokens)
      f = torch::constant_pad_nd(f, {0, 0, 0, padded - tokens});
    return f.view({batch, heads, blocks, block, x.size(3)});
  };
  torch::Tensor qb = prepare(q), kb = prepare(k), vb = prepare(v);

  // Decay tables, as MiniMaxLightningAttention.decay_factors builds them.
  const torch::Tensor s = perHead(slopes, q.device()).unsqueeze(-1);           // [1, H, 1, 1, 1]
  torch::Tensor pos = torch::arange(1, block + 1, qb.options()).view({1, 1, 1, block, 1}); // i + 1
  torch::Tensor queryDecay = torch::exp(-s * pos);                             // exp(-s (i + 1))
  torch::Tensor keyDecay = torch::exp(-s * (double(block) - pos));             // exp(-s (b - 1 - j))
  torch::Tensor gap = pos - pos.transpose(-1, -2);                             // i - j
  torch::Tensor scaled = s * gap;
  torch::Tensor diagonalDecay =
      torch::exp(torch::where(scaled >= 0, -scaled, torch::full_like(scaled, -INFINITY)));
  torch::Tensor blockDecay = torch::exp(-perHead(slopes, q.device()) * double(block)); // [1, H, 1, 1]

  // Inside each block: (Q K^T * decay mask) V.
  torch::Tensor intra = torch::matmul(torch::matmul(qb, kb.transpose(-1, -2)) * diagonalDecay, vb);
  // Each block's contribution to the state, decayed to the block's end.
  torch::Tensor blockStates = torch::matmul((kb * keyDecay).transpose(-1, -2), vb); // [B, H, N, dk, dv]
  // State entering each block: S_0 = 0, S_n = exp(-s b) S_{n-1} + KV_{n-1}.
  std::vector<torch::Tensor> entering;
  entering.reserve(blocks);
  torch::Tensor state = initialState.defined() ? initialState.to(torch::kFloat32)
                                              : torch::zeros({batch, heads, dk, dv}, qb.options());
  entering.push_back(state);
  // unbind, not select: select's backward writes a zero tensor of every
  // block's state per block (O(N^2) work); unbind's stacks them once.
  const std::vector<torch::Tensor> contributions = blockStates.unbind(2);
  for (int64_t n = 1; n < blocks; ++n) {
    state = state * blockDecay + contributions[n - 1];
    entering.push_back(state);
  }
  if (finalState) { // The last block, of its own length L: exp(-s L) S + sum_j exp(-s (L-1-j)) k_j^T v_j.
    const int64_t length = tokens - (blocks - 1) * block;
    torch::Tensor j = torch::arange(length, qb.options()).view({1, 1, length, 1});
    torch::Tensor rate = perHead(slopes, q.device());                               // [1, H, 1, 1]
    torch::Tensor keys = kb.select(2, blocks - 1).narrow(2, 0, length) * torch::exp(-rate * (double(length - 1) - j));
    *finalState = state * torch::exp(-rate * double(length)) +
                  torch::matmul(keys.transpose(-1, -2), vb.select(2, blocks - 1).narrow(2, 0, length));
  }
  torch::Tensor inter = torch::matmul(qb * queryDecay, torch::stack(entering, 2));
  torch::Tensor out = (intra + inter).view({batch, heads, padded, dv});
  if (padded > tokens)
    out = out.narrow(2, 0, tokens);
  return out.to(q.scalar_type());
}

} // namespace adapt::rt
