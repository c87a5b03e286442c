//===- Recompute.h - selective activation recomputation ---------*- C++ -*-===//
//
// Long contexts run out of memory on saved activations, not on weights: a
// layer's attention/FFN intermediates grow with the sequence. recompute()
// runs a function without recording its graph, keeps only its input, and
// runs it again inside the backward pass to get the gradients, trading one
// extra forward of that function for its activations (what Megatron calls
// selective recomputation when it is applied to the memory-heavy parts).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_RECOMPUTE_H
#define ADAPT_RUNTIME_RECOMPUTE_H

#include <torch/custom_class.h>
#include <torch/torch.h>

#include <functional>

namespace adapt::rt {

/// A function of one tensor whose other inputs (frozen weights, adapters)
/// it captures; adapters that require grad get their gradients accumulated
/// when the backward pass reaches the recomputed function.
using RecomputedFunction = std::function<torch::Tensor(const torch::Tensor &)>;

/// fn(x) with the same value and the same gradients (for x and for every
/// tensor fn captures), holding only x between forward and backward. The
/// random generator state of x's device is saved and restored around the
/// recomputation, so dropout draws the same mask twice. Without grad mode,
/// or when nothing needs a gradient, it is fn(x).
torch::Tensor recompute(const RecomputedFunction &fn, const torch::Tensor &x);

/// A function of several tensors with several results.
using RecomputedFunctions = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor> &)>;

/// recompute() for several inputs and results (e.g. a segment of a sequence
/// and the recurrent state entering it -> the segment's output and the
/// state leaving it). Results with no incoming gradient are skipped in the
/// backward pass.
std::vector<torch::Tensor> recompute(const RecomputedFunctions &fn, const std::vector<torch::Tensor> &inputs);

/// Keeps a RecomputedFunctions alive as long as an autograd node that runs
/// it needs it (passed to torch::autograd::Function::apply).
struct FunctionHolder : torch::CustomClassHolder {
  explicit FunctionHolder(RecomputedFunctions f) : fn(std::move(f)) {}
  RecomputedFunctions fn;
};

/// Detached copies of \p inputs that require grad where the inputs do: the
/// leaves of a graph an autograd node records inside itself (recompute()
/// in its backward, the delta rule's TF32 node in its forward).
std::vector<torch::Tensor> detachedLeaves(const std::vector<torch::Tensor> &inputs);

/// Runs the backward pass of the graph recorded on \p leaves (detachedLeaves)
/// from its \p outputs, given the \p gradOutputs arriving at the node
/// (outputs with no incoming gradient, or needing none, are skipped), and
/// returns the leaves' gradients: one entry per leaf, undefined where the
/// leaf needs none or none reaches it. Tensors the graph captured (adapters)
/// get their gradients accumulated as in any backward pass.
std::vector<torch::Tensor> leafGradients(const std::vector<torch::Tensor> &outputs,
                                         const std::vector<torch::Tensor> &gradOutputs,
                                         const std::vector<torch::Tensor> &leaves);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_RECOMPUTE_H
