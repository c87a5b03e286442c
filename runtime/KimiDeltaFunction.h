//===- KimiDeltaFunction.h - the per-channel delta rule, backward written out -*- C++ -*-===//
//
// Kimi Delta Attention's chunked delta rule (a log decay per head, token and
// key channel) as one autograd node whose backward is written out, as
// DeltaRuleFunction.h does for Gated DeltaNet's per-head decay. Per chunk,
// with G the cumulative log decay per channel and P_xy[t][i] = sum_d x_td
// y_id e^{G_td - G_id}:
//   forward: T = (I + strictly-lower(diag(b) P_kk))^-1, W = T (b k e^G),
//     U = T (b v), V_new = U - W S, O = (q e^G) S + P_qk V_new,
//     S' = diag(e^{G_last}) S + (k e^{G_last - G})^T V_new;
//   backward: one reverse pass over the chunks for dS (one batched GEMM per
//     chunk), and the pair products' gradients by the same sub-chunks as
//     their forward (perChannelDecayedScoresBackward), so no factor
//     e^{+-G} exceeds 1.
// It keeps its inputs as given, T, each chunk's entering state and V_new,
// where LibTorch's autograd of the composition kept every intermediate. It is the
// blueprint of the backward kernels. Op checks: `kimi_delta.*`.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_KIMIDELTAFUNCTION_H
#define ADAPT_RUNTIME_KIMIDELTAFUNCTION_H

#include "runtime/LinearAttention.h"

#include <torch/torch.h>

#include <utility>
#include <vector>

namespace adapt::rt {

/// P[t][i] = sum_d x_td y_id e^{cum_td - cum_id} for i <= t within each
/// chunk, zero above: x, y, cum [b, h, n, c, dk] -> [b, h, n, c, c].
torch::Tensor perChannelDecayedScores(const torch::Tensor &x, const torch::Tensor &y, const torch::Tensor &cum);

/// {dx, dy} of perChannelDecayedScores(x, y, cum) for the cotangent \p grad
/// [b, h, n, c, c] (zero above the diagonal). cum's gradient is x dx - y dy.
std::pair<torch::Tensor, torch::Tensor> perChannelDecayedScoresBackward(const torch::Tensor &grad,
                                                                        const torch::Tensor &x, const torch::Tensor &y,
                                                                        const torch::Tensor &cum);

/// The gradients of perChannelDecayedScores(xA, y, cum) for \p gradA and of
/// perChannelDecayedScores(xB, y, cum) for \p gradB: {dxA, dxB, dyA + dyB}.
/// One CUDA kernel by default (ADAPT_KIMI_SCORES_PAIRED_BACKWARD=0: off),
/// each decay factor computed once for both; else two
/// perChannelDecayedScoresBackward calls. Op check:
/// `kimi_scores.paired_backward`.
struct PairedScoreGradients {
  torch::Tensor xA; ///< d xA [b, h, n, c, dk]
  torch::Tensor xB; ///< d xB
  torch::Tensor y;  ///< d y from both products
};
PairedScoreGradients pairedDecayedScoresBackward(const torch::Tensor &gradA, const torch::Tensor &xA,
                                                 const torch::Tensor &gradB, const torch::Tensor &xB,
                                                 const torch::Tensor &y, const torch::Tensor &cum);

/// pairedDecayedScoresBackward for Kimi's backward operands formed from the
/// chunks of its inputs: xA = \p query \p scale, y = \p key and xB = \p key
/// \p beta (q and k [b, h, n, c, dk], beta [b, h, n, c, 1] fp32). On a GPU
/// with bf16 q and k the kernel forms them as it reads the rows (at c 64, dk
/// 128 on tensor cores unless ADAPT_KIMI_SCORES_MMA=0); elsewhere they are made
/// in fp32 first. Op check: `kimi_scores.paired_backward_rows`.
PairedScoreGradients pairedDecayedScoresBackwardFromRows(const torch::Tensor &gradA, const torch::Tensor &gradB,
                                                         const torch::Tensor &query, const torch::Tensor &key,
                                                         const torch::Tensor &beta, const torch::Tensor &cum,
                                                         double scale);

/// Heads per slice of the Kimi node's backward for \p batch sequences of
/// \p paddedTokens tokens (whole chunks) and \p keyDim channels: as many as
/// keep one [B, heads, T, dk] fp32 tensor within 512 MiB (all of 32 heads
/// up to 32K tokens, so training at 2 x 4K runs in one pass; 8 at 128K), or ADAPT_KIMI_BACKWARD_SLICE_HEADS=N (a positive count; anything
/// else stops with an error naming the variable). The backward holds dozens
/// of such tensors at once; each slice's are freed before the next.
int64_t kimiBackwardSliceHeads(int64_t batch, int64_t paddedTokens, int64_t keyDim);

/// {output [B, H, T, dv] in the query's dtype, S_T [B, H, dk, dv] fp32} of
/// the chunked delta rule with a decay per key channel ([B, H, T, dk]), from
/// \p initialState (undefined: zeros), differentiable in every input and the
/// initial state. \p tf32: its fp32 GEMMs may run on TF32 tensor cores.
std::vector<torch::Tensor> perChannelDecayDeltaRule(const DeltaRuleInputs &in, int64_t chunkSize,
                                                    const torch::Tensor &initialState, bool tf32);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_KIMIDELTAFUNCTION_H
