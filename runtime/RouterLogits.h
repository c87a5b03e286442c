//===- RouterLogits.h - fp32 router logits by a bf16 tensor-core GEMM -*- C++ -*-===//
//
// Most references compute the MoE router in fp32 from bf16 hidden states
// (DeepSeek, GLM, Kimi: F.linear(x.float(), W.float())), and the runtime
// does so for every family. As an fp32 GEMM that runs on CUDA cores: ~120 us
// each way per layer at 8,192 tokens, plus a [tokens, hidden] fp32 copy and
// a cast back, ~0.3 ms of a 9 ms MoE layer on the H200 (issue 17).
//
// When the router weight holds bf16 values (as checkpoints store it), each
// product x_h * W_eh of two bf16 numbers is exact in fp32. So a bf16
// tensor-core GEMM accumulating in fp32 with an fp32 output computes the
// same logits as the fp32 GEMM, up to the order of the fp32 summation:
//
//   forward   logits = mm(x, W^T, out fp32)
//   backward  dx = bf16([hi | lo] [W ; W]),  hi = bf16(g), lo = bf16(g - hi)
//
// The backward splits the fp32 logits' gradient g into two bf16 terms that
// hold it to ~2^-17 relative, one GEMM with K = 2E and a bf16 output rounded
// once, as the reference's fp32 product is rounded once to the bf16 hidden
// state's gradient. The router weight is frozen here (no LoRA on it).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_ROUTERLOGITS_H
#define ADAPT_RUNTIME_ROUTERLOGITS_H

#include <torch/torch.h>

namespace adapt::rt {

/// \p weight in bf16 where every value is exactly a bf16 number (so the
/// products above are exact), else undefined: the caller keeps fp32.
torch::Tensor exactBf16Weight(const torch::Tensor &weight);

/// fp32 logits [N, E] of bf16 \p x [N, H] and \p weightBf16 [E, H] (from
/// exactBf16Weight): the file comment's node, differentiable in \p x. Runs
/// wherever at::mm takes bf16 inputs with an fp32 output (CUDA); elsewhere
/// the forward is the fp32 product of the same values and the backward the
/// same split, so the CPU checks its arithmetic.
torch::Tensor exactRouterLogits(const torch::Tensor &x, const torch::Tensor &weightBf16);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_ROUTERLOGITS_H
