//===- DeltaRuleFunction.h - the delta rule with an explicit backward -*- C++ -*-===//
//
// Gated DeltaNet's chunked delta rule (one log decay per head and token) as
// one autograd node whose backward is written out, as flash-linear-attention
// writes its kernels, instead of LibTorch differentiating the composition:
//
//   forward, per chunk (G the chunk's cumulative log decay, D_ti = e^{G_t - G_i}):
//     T = (I + strictly-lower(diag(b) K K^T . D))^-1,  W = T diag(b e^G) K,
//     U = T diag(b) V,  V_new = U - W S,  O = diag(e^G) Q S + (Q K^T . D) V_new,
//     S' = e^{G_last} S + (diag(e^{G_last - G}) K)^T V_new;
//   backward, one reverse pass over the chunks for dS (one batched GEMM per
//   chunk, as the forward's), every other product batched over chunks.
//
// It keeps only the fp32 inputs, T, each chunk's entering state and V_new
// (the composition's autograd kept ~15 fp32 intermediates), and it is the
// blueprint of the backward kernels: each batched product below is one
// tile product of a chunk. Op checks: `gated_delta_rule.*` (values and the
// gradients of q, k, v, decay, beta against a float64 recurrence).
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_DELTARULEFUNCTION_H
#define ADAPT_RUNTIME_DELTARULEFUNCTION_H

#include "runtime/LinearAttention.h"

#include <torch/torch.h>

#include <vector>

namespace adapt::rt {

/// Whether a call on \p in from \p initialState (may be undefined) records
/// a graph: grad mode is on and one of them requires a gradient.
bool deltaRuleNeedsGraph(const DeltaRuleInputs &in, const torch::Tensor &initialState);

/// {output [B, H, T, dv] in the query's dtype, S_T [B, H, dk, dv] fp32} of
/// the chunked delta rule with a per-head decay ([B, H, T]), from \p
/// initialState (undefined: zeros), differentiable in every input and the
/// initial state. \p tf32: its fp32 GEMMs may run on TF32 tensor cores
/// (reduced-precision activations on the GPU). Without a graph to record,
/// bf16 at d 128 on the GPU takes the forward kernels (runtime/cuda/
/// DeltaRuleKernel.h) unless ADAPT_DELTA_RULE_KERNEL=0.
std::vector<torch::Tensor> scalarDecayDeltaRule(const DeltaRuleInputs &in, int64_t chunkSize,
                                                const torch::Tensor &initialState, bool tf32);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_DELTARULEFUNCTION_H
