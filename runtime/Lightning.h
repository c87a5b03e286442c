//===- Lightning.h - MiniMax lightning attention's kernels ------*- C++ -*-===//
//
// Lightning attention (MiniMax-Text-01, MiniMax-M1) is linear attention with
// a fixed per-head exponential decay and no softmax or scale:
//
//   S_t = exp(-s_h) S_{t-1} + k_t^T v_t,    o_t = q_t S_t,
//
// that is o_t = sum_{j<=t} exp(-s_h (t - j)) (q_t . k_j) v_j, with a state
// S [d, d] per head. The decay rate s_h depends on the head count and the
// layer index (lightningSlopes). transformers' MiniMaxLightningAttention
// computes it in blocks of `block_size` tokens: inside a block a masked,
// decayed Q K^T (the only [T, T]-like tensor, one block wide), across blocks
// the state carried with one decay per block. lightningAttentionBlocked is
// that computation (the training form); lightningAttentionRecurrent is the
// one-token-at-a-time definition (a reference). Both compute in fp32 and
// return the input dtype. The blocked form is one autograd node with its
// backward written out (it keeps q, k, v as given and each block's entering
// state); the recurrent form's backward is autograd's.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_LIGHTNING_H
#define ADAPT_RUNTIME_LIGHTNING_H

#include <torch/torch.h>

namespace adapt::rt {

/// Per-head decay rates [heads] (fp32, CPU), as transformers'
/// MiniMaxLightningAttention.get_slope_rate: base^(h+1) with
/// base = 2^(-8/heads), times (1 - layer/(layers - 1 + 1e-5) + 1e-5), so
/// later layers decay slower. (MiniMax's original code interpolates the
/// base for head counts that are not powers of two; transformers does not,
/// and transformers is the reference here.)
torch::Tensor lightningSlopes(int64_t heads, int64_t layerIndex, int64_t numLayers);

/// The recurrent form: one state update per token. q, k, v [B, H, T, d]
/// (v may have its own width), \p slopes [H]. Returns [B, H, T, dv] in q's
/// dtype. O(T) sequential steps: a reference, not for training.
torch::Tensor lightningAttentionRecurrent(const torch::Tensor &q, const torch::Tensor &k,
                                          const torch::Tensor &v, const torch::Tensor &slopes);

/// The blocked (training) form over blocks of \p blockSize tokens (T need not
/// be a multiple; the last block is shorter). Intra-block: (Q K^T masked by
/// exp(-s (i - j)), i >= j) V; inter-block: (Q exp(-s (i + 1))) S; the state
/// S [B, H, d, dv] advances by exp(-s b) S + (K exp(-s (b - 1 - j)))^T V per
/// block of length b. All blocks are computed batched; only the state
/// recurrence loops over blocks. Memory: O(T (d + blockSize)) per head plus
/// one [d, dv] state per block; no tensor spans more than one block in time.
/// Same result as lightningAttentionRecurrent. \p initialState [B, H, d, dv]
/// (fp32; undefined: zeros) is the state before the first token and
/// \p finalState receives the state after the last: context parallelism
/// runs each rank's part of a sequence this way.
torch::Tensor lightningAttentionBlocked(const torch::Tensor &q, const torch::Tensor &k,
                                        const torch::Tensor &v, const torch::Tensor &slopes,
                                        int64_t blockSize,
                                        const torch::Tensor &initialState = {},
                                        torch::Tensor *finalState = nullptr);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LIGHTNING_H
