//===- RouteKernel.h - a MoE router's top-k and weights in one kernel -*- C++ -*-===//
//
// The built-in routers that score every expert (softmax or sigmoid, with
// bias correction and group-limited selection) are, as LibTorch ops, ~7
// kernels forward (two softmaxes, top-k, gather, sum, divide, scale) and ~8
// backward over [tokens, experts] and [tokens, k] tensors, ~0.1 ms per MoE
// layer at 8,192 tokens on the H200, top-k alone 51 us. Here one warp per
// token does each direction: the scores, the group and expert selection
// (ties to the lower index), the normalised, scaled weights; and backward
// the logits' gradient from the weights'. Built where nvcc is
// (ADAPT_WITH_CUDA_KERNELS); runtime/Ops.cpp keeps the composition as the
// CPU path and the reference.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_ROUTEKERNEL_H
#define ADAPT_RUNTIME_CUDA_ROUTEKERNEL_H

#include <ATen/core/Tensor.h>

#include <utility>

namespace adapt::rt::cuda {

/// How a router scores and weighs (RouterKind::SoftmaxTopK or SigmoidTopK).
struct RouteSpec {
  bool sigmoid = false;       ///< Sigmoid scores (+ bias for selection); else softmax.
  int64_t topK = 1;
  int64_t groups = 1, topKGroups = 1; ///< Group-limited selection (sigmoid).
  bool normTopK = false;
  double scaling = 1.0;
};

/// Whether the kernels take \p logits ([N, E] fp32 CUDA) routed as \p spec:
/// E <= 1024, k <= 32 and <= E, groups dividing E, at most 32 of them.
bool routeKernelFits(const at::Tensor &logits, const RouteSpec &spec);

/// The experts ([N, k] int64, best first) and their weights ([N, k] fp32)
/// of \p logits; \p bias ([E], any float dtype) may be undefined.
std::pair<at::Tensor, at::Tensor> routeForward(const at::Tensor &logits, const at::Tensor &bias,
                                               const RouteSpec &spec);

/// d logits [N, E] fp32 from the weights' gradient \p gradWeights [N, k],
/// the same \p logits and the \p experts routeForward chose.
at::Tensor routeBackward(const at::Tensor &logits, const at::Tensor &experts, const at::Tensor &gradWeights,
                         const RouteSpec &spec);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_ROUTEKERNEL_H
