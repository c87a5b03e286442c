//===- DeltaRuleKernel.h - the chunked gated delta rule's forward -*- C++ -*-===//
//
// Gated DeltaNet's chunked delta rule (one log decay per head and token) as
// three tensor-core kernels, the decomposition flash-linear-attention uses:
//   1. per chunk, in parallel: the UT transform. A = strictly-lower(beta_t
//      k_t.k_i exp(G_t - G_i)), T = (I + A)^-1 by forward substitution in
//      shared memory, W = T (beta k exp(G)) and U = T (beta v);
//   2. per head and 32 value columns, over the chunks in order: the state
//      S (fp32, in the mma accumulators) with V_new = U - W S and
//      S <- exp(G_last) S + (k exp(G_last - G))^T V_new;
//   3. per chunk, in parallel: O = (q exp(G)) S_n + causal(q k^T exp(G_t -
//      G_i)) V_new.
// mma.sync m16n8k16 with bf16 operands and fp32 accumulation; the states,
// W, U and V_new pass between kernels in bf16, as fla's do. The layer's
// forward without a graph (no-grad, recomputation's first pass, the
// segmented form's forward) takes it unless ADAPT_DELTA_RULE_KERNEL=0;
// the LibTorch node (runtime/DeltaRuleFunction.cpp) stays the reference,
// the training path with its backward, and the CPU path.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_DELTARULEKERNEL_H
#define ADAPT_RUNTIME_CUDA_DELTARULEKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether gatedDeltaRuleForward takes these inputs: CUDA bf16 \p query,
/// \p key [B, H, T, 128] and \p value [B, H, T, 128] with unit last stride,
/// the other strides multiples of 8 and 16-byte aligned data; \p decay [B,
/// H, T] (one per head) and \p beta [B, H, T] of any float dtype; chunk 64.
bool deltaRuleForwardTakes(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                           const at::Tensor &decay, const at::Tensor &beta, int64_t chunkSize);

/// What the forward computes that the backward (runtime/DeltaRuleFunction)
/// reads; n chunks of 64 over B·H heads.
struct DeltaRuleSaved {
  at::Tensor inverse;   ///< T = (I + A)^-1 per chunk, bf16 [B·H, n·64, 64]: the
                        ///< product form both kernels use (the forward's W and U,
                        ///< the backward's mma tiles); fp32 until session 46.
  at::Tensor states;    ///< Each chunk's entering state, bf16 [B·H, n, 128, 128].
  at::Tensor newValues; ///< V_new, bf16 [B·H, n·64, 128].
  at::Tensor cum;       ///< The chunk's cumulative log decay, fp32 [B·H, n·64].
  at::Tensor w;         ///< W = T (beta k e^G), bf16 [B·H, n·64, 128].
};

/// The chunked gated delta rule's output [B, H, T, 128] (bf16, contiguous),
/// the query scaled by 1/sqrt(dk) inside. \p initialState [B, H, 128, 128]
/// fp32 may be undefined (zeros); \p finalState, if given, receives S_T
/// [B, H, 128, 128] in fp32; \p saved, if given, what the backward reads.
at::Tensor gatedDeltaRuleForward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                 const at::Tensor &decay, const at::Tensor &beta, const at::Tensor &initialState,
                                 at::Tensor *finalState, DeltaRuleSaved *saved = nullptr);

/// The state's gradient through the chunks, last to first (the backward's
/// serial part, in DeltaRuleBackwardKernel.cu): per chunk n, with dS' the
/// gradient of the state leaving it,
///   dV_new = localNew + Kd dS',  dS = e^{G_last} dS' + Qd^T dO - W^T dV_new.
struct DeltaRuleStateGrads {
  at::Tensor leaving;     ///< dS' of each chunk [B·H, n, 128, 128]: fp32, or bf16 when leanBackward().
  at::Tensor newValues;   ///< dV_new [B·H, n·64, 128]: fp32, or bf16 when leanBackward().
  at::Tensor initial;     ///< dS of the first chunk's entering state, fp32 [B·H, 128, 128].
};

/// Whether deltaRuleStateBackward takes dk = \p keyDim, dv = \p valueDim and \p chunkSize.
bool deltaRuleStateBackwardTakes(int64_t keyDim, int64_t valueDim, int64_t chunkSize);

/// \p keysToEnd (Kd = k e^{G_last - G}), \p queryDecayed (Qd = q scale e^G),
/// \p w (undefined: W = 0, for a scalar decay only) and \p gradOut:
/// contiguous bf16 [B·H, n·64, 128]; \p localNew (P^T
/// dO) fp32 [B·H, n·64, 128]; \p cum fp32 [B·H, n·64]; \p gradFinal fp32
/// [B·H, 128, 128] (the gradient of S_T). With \p perChannel (Kimi's decay
/// per key channel; Kd and Qd carry it per channel), \p cum is each chunk's
/// last G per channel [B·H, n, 128], and the gradients stay fp32.
DeltaRuleStateGrads deltaRuleStateBackward(const at::Tensor &keysToEnd, const at::Tensor &queryDecayed,
                                           const at::Tensor &w, const at::Tensor &gradOut,
                                           const at::Tensor &localNew, const at::Tensor &cum,
                                           const at::Tensor &gradFinal, bool perChannel = false);

/// The gradients of gatedDeltaRuleForward's inputs: query, key, value bf16
/// [B, H, T, 128]; decay, beta fp32 [B, H, T]; the initial state fp32 [B,
/// H, 128, 128].
struct DeltaRuleGrads {
  at::Tensor query, key, value, decay, beta, initialState;
};

/// The whole backward of gatedDeltaRuleForward on the GPU
/// (DeltaRuleChunkBackwardKernel.cu): from the forward's inputs, what it
/// \p saved, and the gradients of its output \p gradOut [B, H, T, 128] and
/// of the final state \p gradFinal [B, H, 128, 128] (either may be
/// undefined: zeros).
DeltaRuleGrads gatedDeltaRuleBackward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                      const at::Tensor &beta, const DeltaRuleSaved &saved, const at::Tensor &gradOut,
                                      const at::Tensor &gradFinal);

/// Whether decayedLinearAttentionForward takes these inputs: CUDA bf16
/// \p query, \p key and \p value [B, H, T, 128] with packable rows (as
/// deltaRuleForwardTakes).
bool linearAttentionTakes(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value);

/// Linear attention with a scalar log decay per head and token and no delta
/// rule: S_t = e^{g_t} S_{t-1} + k_t^T v_t, o_t = scale q_t S_t (fla's simple
/// GLA; MiniMax's lightning attention is g = -s_h). It is the delta rule
/// with W = 0 and U = V, so it runs the delta rule's state and output
/// kernels (no UT transform): \p decay [B, H, T] (any float dtype, g per
/// token), the rest as gatedDeltaRuleForward. \p saved keeps what
/// decayedLinearAttentionBackward reads (no inverse, no w: the state kernels
/// are instantiated without W's products, Delta = false).
at::Tensor decayedLinearAttentionForward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                         const at::Tensor &decay, float scale, const at::Tensor &initialState,
                                         at::Tensor *finalState, DeltaRuleSaved *saved);

/// The gradients of decayedLinearAttentionForward's query, key, value and
/// initial state (bf16, bf16, bf16, fp32; decay and beta undefined): the
/// delta rule backward's first three kernels, whose dk part and dV_new are
/// then the whole dk and dv. \p gradOut and \p gradFinal as
/// gatedDeltaRuleBackward's.
DeltaRuleGrads decayedLinearAttentionBackward(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                                              const DeltaRuleSaved &saved, const at::Tensor &gradOut,
                                              const at::Tensor &gradFinal, float scale);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_DELTARULEKERNEL_H
