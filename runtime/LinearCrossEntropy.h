//===- LinearCrossEntropy.h - fused, chunked LM head + loss ------*- C++ -*-===//
//
// The LM head and the cross-entropy in one pass over row chunks, so the
// [tokens, vocab] logits never exist whole: for 8,192 tokens of a 152K
// vocabulary that is 5 GB of fp32 logits, their softmax and their gradient
// that the plain composition (linear, cast, cross_entropy) keeps alive
// between the forward and the backward pass.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_LINEARCROSSENTROPY_H
#define ADAPT_RUNTIME_LINEARCROSSENTROPY_H

#include <torch/torch.h>

namespace adapt::rt {

/// The sum over rows of cross_entropy(h W^T, targets), rows whose target is
/// -100 left out: h [N, hidden], weight [vocab, hidden] (the frozen LM head),
/// targets [N] int64. Each chunk of \p chunkRows rows (0: chosen from the
/// vocabulary so one chunk's fp32 logits stay near 512 MiB) is one matmul in
/// the model dtype, cast to fp32 for the log-sum-exp, exactly like
/// torch::linear(h, W).to(fp32) followed by cross_entropy. When h requires
/// grad, its gradient (softmax - one-hot, times W, in the model dtype) is
/// computed in the same pass and only scaled by the incoming gradient in the
/// backward pass, which then runs no matmul; no gradient flows to \p weight.
torch::Tensor linearCrossEntropySum(const torch::Tensor &h, const torch::Tensor &weight,
                                    const torch::Tensor &targets, int64_t chunkRows = 0);

/// The rows per chunk linearCrossEntropySum uses for \p vocab when given 0.
int64_t linearCrossEntropyChunkRows(int64_t vocab);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_LINEARCROSSENTROPY_H
