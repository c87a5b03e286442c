//===- Lightning.cpp - MiniMax lightning attention's kernels --------------===//

#include "runtime/Lightning.h"

#include "runtime/Errors.h"
#include "runtime/KernelLedger.h"
#include "runtime/Tf32Scope.h"
#include "runtime/cuda/Switches.h"

#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/DeltaRuleKernel.h"
#endif

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

namespace {

using torch::Tensor;

/// A sequence in blocks: \p x [B, H, T, d] as fp32 [B, H, N, block, d],
/// tokens past the end zero. As keys and values they add nothing, and their
/// query rows are dropped; the decays of a short last block are the
/// prefixes of a full block's, so its outputs are unchanged.
Tensor toBlocks(const Tensor &x, int64_t block, int64_t blocks) {
  Tensor f = x.to(torch::kFloat32);
  const int64_t padded = blocks * block, tokens = x.size(2);
  if (padded > tokens)
    f = torch::constant_pad_nd(f, {0, 0, 0, padded - tokens});
  return f.view({x.size(0), x.size(1), blocks, block, x.size(3)});
}

/// [B, H, N, block, d] blocks back to [B, H, T, d] in \p dtype.
Tensor fromBlocks(const Tensor &x, int64_t tokens, torch::ScalarType dtype) {
  Tensor out = x.reshape({x.size(0), x.size(1), x.size(2) * x.size(3), x.size(4)});
  if (out.size(2) > tokens)
    out = out.narrow(2, 0, tokens);
  return out.to(dtype);
}

/// The decay tables of one block length, as MiniMaxLightningAttention's
/// decay_factors builds them, fp32 on the inputs' device.
struct BlockDecays {
  Tensor query; ///< e^{-s (i + 1)}: the entering state's decay at row i [1, H, 1, b, 1].
  Tensor key;   ///< e^{-s (b - 1 - j)}: key j's decay to the block's end [1, H, 1, b, 1].
  Tensor pairs; ///< e^{-s (i - j)} for i >= j, else 0 [1, H, 1, b, b].
  Tensor rate;  ///< s [1, H, 1, 1].

  BlockDecays(const Tensor &slopes, int64_t b, const torch::TensorOptions &options) {
    rate = perHead(slopes, options.device());
    const Tensor s = rate.unsqueeze(-1);                                          // [1, H, 1, 1, 1]
    const Tensor pos = torch::arange(1, b + 1, options).view({1, 1, 1, b, 1});   // i + 1
    query = torch::exp(-s * pos);
    key = torch::exp(-s * (double(b) - pos));
    const Tensor scaled = s * (pos - pos.transpose(-1, -2));                      // s (i - j)
    pairs = torch::exp(torch::where(scaled >= 0, -scaled, torch::full_like(scaled, -INFINITY)));
  }

  /// The decay of the last block's key j to its own end, e^{-s (L - 1 - j)}
  /// for its \p length tokens [1, H, L, 1].
  Tensor lastKeyDecay(int64_t length, const torch::TensorOptions &options) const {
    const Tensor j = torch::arange(length, options).view({1, 1, length, 1});
    return torch::exp(-rate * (double(length - 1) - j));
  }
};

/// The state entering each block [B, H, N, dk, dv] (fp32): S_0 = \p initial,
/// S_n = e^{-s b} S_{n-1} + C_{n-1} with C_n = (K_n e^{-s (b-1-j)})^T V_n,
/// from the fp32 blocks \p kb, \p vb [B, H, N, b, d]. One launch a block,
/// written in place. (A grouped scan, one batched GEMM per 16 blocks, took
/// 10 % longer at 64 heads x 8K and 32K on an H100: its extra passes over
/// the states cost more than the launches it saves.)
Tensor enteringStates(const Tensor &kb, const Tensor &vb, const BlockDecays &decays, const Tensor &initial,
                      int64_t block) {
  const int64_t blocks = kb.size(2);
  Tensor states = torch::empty({kb.size(0), kb.size(1), blocks, kb.size(4), vb.size(4)}, kb.options());
  states.select(2, 0).copy_(initial);
  if (blocks == 1)
    return states;
  const Tensor contributions = torch::matmul((kb.narrow(2, 0, blocks - 1) * decays.key).transpose(-1, -2),
                                             vb.narrow(2, 0, blocks - 1));
  const Tensor decay = torch::exp(-decays.rate * double(block)); // [1, H, 1, 1]
  for (int64_t n = 1; n < blocks; ++n) {
    Tensor entering = states.select(2, n);
    torch::addcmul_out(entering, contributions.select(2, n - 1), states.select(2, n - 1), decay);
  }
  return states;
}

/// Lightning attention in blocks as one autograd node, its backward written
/// out: it keeps q, k, v as given and each block's entering state (fp32),
/// and rebuilds the scores, where autograd of the blocked composition kept
/// the fp32 blocks, the masked scores and every decayed operand. Outputs
/// {O [B, H, T, dv] in q's dtype, the state after the last token, fp32}.
struct LightningNode : torch::autograd::Function<LightningNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const Tensor &q,
                                                const Tensor &k, const Tensor &v, const Tensor &slopes,
                                                const Tensor &state, int64_t block, bool tf32) {
    const Tf32Scope scope(tf32);
    const int64_t tokens = q.size(2), blocks = (tokens + block - 1) / block;
    const Tensor qb = toBlocks(q, block, blocks), kb = toBlocks(k, block, blocks), vb = toBlocks(v, block, blocks);
    const BlockDecays decays(slopes, block, qb.options());
    // Inside each block: (Q K^T * decay mask) V; each block's contribution
    // to the state, decayed to the block's end.
    // (In place where a [.., b, b] or [.., b, d] fp32 temporary would sit
    // beside its source: 512 MiB a scores tensor at 64 heads x 8K, block 256.)
    Tensor out = torch::matmul(torch::matmul(qb, kb.transpose(-1, -2)).mul_(decays.pairs), vb);
    // The state entering each block: S_0 given, S_n = e^{-s b} S_{n-1} + C_{n-1}.
    const Tensor initial = state.to(torch::kFloat32);
    const Tensor states = enteringStates(kb, vb, decays, initial, block);
    // The last block, of its own length L: e^{-s L} S + sum_j e^{-s (L-1-j)} k_j^T v_j.
    const int64_t length = tokens - (blocks - 1) * block;
    const Tensor last = states.select(2, blocks - 1) * torch::exp(-decays.rate * double(length)) +
                        torch::matmul((kb.select(2, blocks - 1).narrow(2, 0, length) *
                                       decays.lastKeyDecay(length, qb.options()))
                                          .transpose(-1, -2),
                                      vb.select(2, blocks - 1).narrow(2, 0, length));
    out.add_(torch::matmul(qb * decays.query, states));
    ctx->saved_data["block"] = block;
    ctx->saved_data["tf32"] = tf32;
    ctx->saved_data["stateDtype"] = int64_t(state.scalar_type());
    ctx->set_materialize_grads(false); // an unused final state's gradient stays undefined
    ctx->save_for_backward({q, k, v, slopes, states});
    return {fromBlocks(out, tokens, q.scalar_type()), last};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const Tf32Scope scope(ctx->saved_data["tf32"].toBool());
    const std::vector<Tensor> saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &slopes = saved[3], &states = saved[4];
    const int64_t block = ctx->saved_data["block"].toInt(), tokens = q.size(2), blocks = states.size(2);
    const int64_t length = tokens - (blocks - 1) * block;
    const Tensor qb = toBlocks(q, block, blocks), kb = toBlocks(k, block, blocks), vb = toBlocks(v, block, blocks);
    const BlockDecays decays(slopes, block, qb.options());
    const Tensor dOut = grads[0].defined() ? toBlocks(grads[0], block, blocks)
                                           : torch::zeros({q.size(0), q.size(1), blocks, block, v.size(3)}, qb.options());
    const Tensor &dLast = grads[1];

    // Inside each block: O = (Q K^T * D) V. Each [.., b, b] fp32 tensor is
    // freed after its last reader, and products land in place, so that at
    // most one sits beside the gradients (the peak, counted by runtime-unit
    // Lightning.TrainingPeakHoldsOneScoresBlock).
    Tensor dScores = torch::matmul(dOut, vb.transpose(-1, -2)).mul_(decays.pairs);
    Tensor dq = torch::matmul(dScores, kb);
    Tensor dk = torch::matmul(dScores.transpose(-1, -2), qb);
    dScores.reset();
    Tensor dv = torch::matmul(torch::matmul(qb, kb.transpose(-1, -2)).mul_(decays.pairs).transpose(-1, -2), dOut);
    // Across blocks: O += (Q e^{-s (i+1)}) S_n.
    dq.add_(torch::matmul(dOut, states.transpose(-1, -2)).mul_(decays.query));
    // The entering states' gradients [B, H, N, dk, dv], then from the last
    // block back, in place: dS_{n-1} += e^{-s b} dS_n, the final state's
    // gradient entering the last block's state.
    Tensor dStates = torch::matmul((qb * decays.query).transpose(-1, -2), dOut);
    if (dLast.defined())
      dStates.select(2, blocks - 1).add_(dLast.to(torch::kFloat32) * torch::exp(-decays.rate * double(length)));
    const Tensor blockDecay = torch::exp(-decays.rate * double(block));
    for (int64_t n = blocks - 1; n >= 1; --n)
      dStates.select(2, n - 1).addcmul_(dStates.select(2, n), blockDecay);
    // C_n = (K e^{-s (b-1-j)})^T V feeds S_{n+1}: its gradient is dS_{n+1} (none for the last block).
    if (blocks > 1) {
      const Tensor dC = dStates.narrow(2, 1, blocks - 1);
      const Tensor kEarlier = kb.narrow(2, 0, blocks - 1), vEarlier = vb.narrow(2, 0, blocks - 1);
      dk.narrow(2, 0, blocks - 1).add_(torch::matmul(vEarlier, dC.transpose(-1, -2)).mul_(decays.key));
      dv.narrow(2, 0, blocks - 1).add_(torch::matmul(kEarlier * decays.key, dC));
    }
    if (dLast.defined()) { // the last block's own term of the final state
      const Tensor g = dLast.to(torch::kFloat32);
      const Tensor decay = decays.lastKeyDecay(length, qb.options());
      const Tensor lastValues = vb.select(2, blocks - 1).narrow(2, 0, length);
      dk.select(2, blocks - 1).narrow(2, 0, length).add_(torch::matmul(lastValues, g.transpose(-1, -2)) * decay);
      dv.select(2, blocks - 1).narrow(2, 0, length).add_(
          torch::matmul(kb.select(2, blocks - 1).narrow(2, 0, length) * decay, g));
    }
    return {fromBlocks(dq, tokens, q.scalar_type()), fromBlocks(dk, tokens, k.scalar_type()),
            fromBlocks(dv, tokens, v.scalar_type()), Tensor(),
            dStates.select(2, 0).to(static_cast<torch::ScalarType>(ctx->saved_data["stateDtype"].toInt())), Tensor(),
            Tensor()};
  }
};

#ifdef ADAPT_WITH_CUDA_KERNELS
/// Whether lightning attention takes the delta rule's kernels with W = 0
/// (cuda::decayedLinearAttentionForward): on since its op checks passed on
/// an H100 (session 53; ADAPT_LIGHTNING_KERNEL=0: the blocked composition).
bool lightningKernelEnabled() {
  static const bool on = !cuda::switchedOff("ADAPT_LIGHTNING_KERNEL");
  return on;
}

/// Lightning attention on the kernels: the log decay -s_h at every token,
/// no scale, chunks of 64 (the result does not depend on the block). Keeps
/// q, k, v as given and what the forward kernels saved (each chunk's
/// entering state, bf16; the values as the kernels' rows, v itself where it
/// is contiguous and fills whole chunks; no W: its products are skipped).
/// Outputs {O (bf16), the state after the last token, fp32}.
struct LightningKernelNode : torch::autograd::Function<LightningKernelNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const Tensor &q,
                                                const Tensor &k, const Tensor &v, const Tensor &slopes,
                                                const Tensor &state) {
    const Tensor decay = slopes.to(q.device(), torch::kFloat32).neg().view({1, -1, 1}).expand({q.size(0), q.size(1), q.size(2)});
    cuda::DeltaRuleSaved saved;
    Tensor last;
    Tensor out = cuda::decayedLinearAttentionForward(q, k, v, decay, 1.0f, state, &last, &saved);
    ctx->saved_data["stateDtype"] = int64_t(state.scalar_type());
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({q, k, v, saved.states, saved.newValues, saved.cum});
    return {out, last};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<Tensor> s = ctx->get_saved_variables();
    const cuda::DeltaRuleSaved saved{Tensor(), s[3], s[4], s[5], Tensor()};
    cuda::DeltaRuleGrads g = cuda::decayedLinearAttentionBackward(s[0], s[1], s[2], saved, grads[0], grads[1], 1.0f);
    return {g.query, g.key, g.value, Tensor(),
            g.initialState.to(static_cast<torch::ScalarType>(ctx->saved_data["stateDtype"].toInt()))};
  }
};
#endif

} // namespace

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
  // TF32 tensor cores for the fp32 GEMMs when the activations are bf16/fp16
  // (their products are exact in TF32; ADAPT_LIGHTNING_TF32=0: IEEE fp32).
  const bool tf32 = reducedFloat(q) && !cuda::switchedOff("ADAPT_LIGHTNING_TF32");
  const torch::Tensor state = initialState.defined()
                                  ? initialState
                                  : torch::zeros({batch, heads, dk, dv}, q.options().dtype(torch::kFloat32));
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (chooseKernel("lightning", q, lightningKernelEnabled(), cuda::linearAttentionTakes(q, k, v))) {
    torch::autograd::variable_list outs = LightningKernelNode::apply(q, k, v, slopes, state);
    if (finalState)
      *finalState = outs[1];
    return outs[0];
  }
#endif
  torch::autograd::variable_list outs = LightningNode::apply(q, k, v, slopes, state, block, tf32);
  if (finalState)
    *finalState = outs[1];
  return outs[0];
}

} // namespace adapt::rt
