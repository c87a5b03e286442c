//===- CrossEntropyKernel.h - softmax cross-entropy over logit rows -*- C++ -*-===//
//
// CUDA kernels of the runtime, built where nvcc is (ADAPT_WITH_CUDA_KERNELS);
// each has a LibTorch composition beside it that stays the CPU path and the
// op stage's reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_CROSSENTROPYKERNEL_H
#define ADAPT_RUNTIME_CUDA_CROSSENTROPYKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Per row of \p logits [rows, vocab] (CUDA, contiguous, any float dtype):
/// loss[row] = logsumexp(row) - row[target] in fp32 (0 where the target is
/// -100), and with \p grad the row overwritten by softmax(row) - one-hot(target)
/// (zeros where the target is -100), computed in fp32 and stored in the
/// logits' dtype. One block per row.
void softmaxCrossEntropyRowsInPlace(at::Tensor &logits, const at::Tensor &targets, at::Tensor &loss, bool grad);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_CROSSENTROPYKERNEL_H
