//===- LinearAttention.h - linear attention's stateless kernels -*- C++ -*-===//
//
// The ops of the gated delta rule family (Qwen3-Next's Gated DeltaNet,
// Kimi-Linear's delta attention): the short causal depthwise convolution,
// L2 and gated RMS norms, and the gated delta rule itself in two forms:
//
//   S_t = (I - b_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T,
//   o_t = S_t^T q_t / sqrt(dk),
//
// with a per-head state S [dk, dv]. The decay g_t is one scalar per head and
// token (GDN) or one value per key channel (KDA). The recurrent form loops
// over tokens (a reference); the chunked form is the training form: the
// WY/UT transform solves a chunk's delta updates with triangular solves,
// the state is carried from chunk to chunk, so work is O(T d^2) per head and
// no tensor spans more than one chunk in time. Both compute in fp32 (as
// transformers' torch fallbacks do) and return the input dtype. With one
// decay per head the chunked form's backward is written out
// (runtime/DeltaRuleFunction.h); with one per key channel it is LibTorch
// autograd's.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_LINEARATTENTION_H
#define ADAPT_RUNTIME_LINEARATTENTION_H

#include <torch/torch.h>

namespace adapt::rt {

/// Causal depthwise convolution over time followed by SiLU, as transformers'
/// causal_conv1d_fn fallback: x [B, T, C], \p weight [C, 1, K] or [C, K];
/// output t sees inputs t-K+1..t (zeros before the start). Returns [B, T, C]
/// row-major: the q, k and v split from it then reach the delta rule's CUDA
/// kernels with unit-stride rows (a [B, C, T] transposed view did not).
/// \p previous [B, K-1, C], when defined, are the inputs just before x (the
/// previous rank's under context parallelism) instead of zeros.
torch::Tensor causalConv1dSilu(const torch::Tensor &x, const torch::Tensor &weight,
                               const torch::Tensor &previous = {});

/// x * rsqrt(sum(x^2) + eps) over the last dim (the FLA/transformers l2norm),
/// in fp32 (or x's wider dtype) and rounded once to x's dtype; one CUDA
/// kernel each way on a GPU (runtime/cuda/L2NormKernel.h).
torch::Tensor l2Normalize(const torch::Tensor &x, double eps = 1e-6);

/// Gated RMSNorm (Qwen3-Next's RMSNormGated): rmsnorm(x) * weight * silu(z)
/// over the last dim, statistics and gate in fp32, the normalised x rounded
/// to x's dtype before the weight (as transformers), result in x's dtype.
torch::Tensor gatedRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                           const torch::Tensor &gate, double eps);

/// Kimi-Linear's gated RMSNorm (KimiLinearRMSNormGated): rmsnorm(x) *
/// weight * sigmoid(z), everything in fp32 (weight too), result in x's dtype.
torch::Tensor sigmoidGatedRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                                  const torch::Tensor &gate, double eps);

/// The inputs of the gated delta rule for H heads over T tokens.
struct DeltaRuleInputs {
  torch::Tensor query; ///< [B, H, T, dk], unscaled (the op scales by 1/sqrt(dk)).
  torch::Tensor key;   ///< [B, H, T, dk].
  torch::Tensor value; ///< [B, H, T, dv].
  /// Log decay (<= 0): [B, H, T] one per head (GDN) or [B, H, T, dk] per key
  /// channel (KDA).
  torch::Tensor decay;
  torch::Tensor beta;  ///< [B, H, T] write strength.
};

/// The delta rule's inputs from a layer's [B, T, heads, ...] tensors: heads
/// before time, query and key L2-normalised in fp32 (as the reference) and
/// rounded back to the value's dtype, as flash-linear-attention's fused
/// l2norm does. In bf16 training the op so gets bf16 q, k and v, which its
/// CUDA kernels need (with fp32 q and k every layer fell back to the LibTorch
/// composition); fp32 layers stay fp32 throughout.
DeltaRuleInputs deltaInputs(const torch::Tensor &query, const torch::Tensor &key, const torch::Tensor &value,
                            const torch::Tensor &decay, const torch::Tensor &beta);

/// The recurrent form: one state update per token. A reference, O(T) steps.
/// Returns [B, H, T, dv] in the query's dtype; \p finalState (if given)
/// receives S_T [B, H, dk, dv] in fp32.
torch::Tensor gatedDeltaRuleRecurrent(const DeltaRuleInputs &in, torch::Tensor *finalState = nullptr);

/// The chunked (training) form over chunks of \p chunkSize tokens (T need
/// not be a multiple). Same result and outputs as gatedDeltaRuleRecurrent.
/// Memory per head: O(T (dk + dv)) plus O(T C) for the intra-chunk
/// matrices, O(T C dk) with a per-channel decay.
torch::Tensor gatedDeltaRuleChunked(const DeltaRuleInputs &in, int64_t chunkSize,
                                    torch::Tensor *finalState = nullptr);

/// The chunked form over segments of \p segmentTokens tokens (rounded down to
/// whole chunks), each recomputed in the backward pass (Recompute.h): between
/// forward and backward only the inputs and the [B, H, dk, dv] state at each
/// segment boundary are kept, so the activation memory of the op is one
/// segment's instead of the whole sequence's (the chunked form keeps ~40 fp32
/// values per token, head and channel for its backward). Same values and
/// gradients as gatedDeltaRuleChunked, for one more forward of compute. With
/// \p segmentTokens 0 (or >= T), or without grad mode, it is that function.
torch::Tensor gatedDeltaRuleSegmented(const DeltaRuleInputs &in, int64_t chunkSize, int64_t segmentTokens);

/// The segment length \p segmentTokens (> 0) means for chunks of
/// \p chunkSize: rounded down to whole chunks, at least one.
int64_t deltaRuleSegmentLength(int64_t segmentTokens, int64_t chunkSize);

/// gatedDeltaRuleSegmented from \p initialState [B, H, dk, dv] (fp32;
/// undefined: zeros); \p finalState receives the leaving state. Context
/// parallelism runs each rank's part of a sequence this way.
torch::Tensor gatedDeltaRuleSegmented(const DeltaRuleInputs &in, int64_t chunkSize, int64_t segmentTokens,
                                      const torch::Tensor &initialState, torch::Tensor *finalState);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LINEARATTENTION_H
