//===- Recompute.cpp - selective activation recomputation -----------------===//

#include "runtime/Recompute.h"

#include <ATen/core/Generator.h>
#include <torch/custom_class.h>

#include <mutex>

namespace adapt::rt {
namespace {

/// The generator dropout draws from on \p device.
at::Generator generatorOf(const torch::Device &device) {
  return at::globalContext().defaultGenerator(device);
}

torch::Tensor generatorState(const torch::Device &device) {
  at::Generator gen = generatorOf(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setGeneratorState(const torch::Device &device, const torch::Tensor &state) {
  at::Generator gen = generatorOf(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// The autograd node: forward without a graph, backward by recomputing. The
/// inputs arrive as one tensor list (each element an autograd input), led by
/// \p always, an empty tensor that requires grad, so the node is recorded
/// even when no input requires grad but the function's adapters do.
struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, at::TensorList inputs,
                                                c10::intrusive_ptr<FunctionHolder> holder) {
    std::vector<torch::Tensor> xs(inputs.begin() + 1, inputs.end());
    const torch::Device device = xs.front().device();
    ctx->saved_data["rng"] = generatorState(device);
    std::vector<torch::Tensor> ys;
    {
      torch::NoGradGuard noGrad;
      ys = holder->fn(xs);
    }
    ctx->save_for_backward(xs);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    return ys;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list gradOutputs) {
    std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<FunctionHolder>(ctx->saved_data["fn"].toCapsule());
    const torch::Device device = saved.front().device();
    torch::Tensor current = generatorState(device);
    setGeneratorState(device, ctx->saved_data["rng"].toTensor());
    const std::vector<torch::Tensor> inputs = detachedLeaves(saved);
    std::vector<torch::Tensor> ys;
    {
      torch::AutoGradMode enable(true);
      ys = holder->fn(inputs);
    }
    setGeneratorState(device, current);
    torch::autograd::variable_list result{torch::Tensor()}; // for `always`
    for (const torch::Tensor &g : leafGradients(ys, gradOutputs, inputs))
      result.push_back(g);
    result.push_back(torch::Tensor()); // for the holder
    return result;
  }
};

} // namespace

std::vector<torch::Tensor> detachedLeaves(const std::vector<torch::Tensor> &inputs) {
  std::vector<torch::Tensor> leaves;
  leaves.reserve(inputs.size());
  for (const torch::Tensor &x : inputs)
    leaves.push_back(x.detach().requires_grad_(x.requires_grad()));
  return leaves;
}

std::vector<torch::Tensor> leafGradients(const std::vector<torch::Tensor> &outputs,
                                         const std::vector<torch::Tensor> &gradOutputs,
                                         const std::vector<torch::Tensor> &leaves) {
  std::vector<torch::Tensor> roots, grads;
  for (size_t i = 0; i < outputs.size() && i < gradOutputs.size(); ++i)
    if (gradOutputs[i].defined() && outputs[i].requires_grad())
      roots.push_back(outputs[i]), grads.push_back(gradOutputs[i]);
  // backward, not grad: tensors the function captured (adapters) get their
  // gradients accumulated too.
  if (!roots.empty())
    torch::autograd::backward(roots, grads);
  std::vector<torch::Tensor> result;
  for (const torch::Tensor &x : leaves)
    result.push_back(x.requires_grad() ? x.grad() : torch::Tensor());
  return result;
}

std::vector<torch::Tensor> recompute(const RecomputedFunctions &fn, const std::vector<torch::Tensor> &inputs) {
  if (!torch::GradMode::is_enabled() || inputs.empty())
    return fn(inputs);
  static thread_local torch::Tensor always = torch::empty({0}).requires_grad_();
  std::vector<torch::Tensor> all{always};
  all.insert(all.end(), inputs.begin(), inputs.end());
  return RecomputeFunction::apply(at::TensorList(all), c10::make_intrusive<FunctionHolder>(fn));
}

torch::Tensor recompute(const RecomputedFunction &fn, const torch::Tensor &x) {
  if (!torch::GradMode::is_enabled())
    return fn(x);
  return recompute([fn](const std::vector<torch::Tensor> &in) { return std::vector<torch::Tensor>{fn(in[0])}; },
                   std::vector<torch::Tensor>{x})[0];
}

} // namespace adapt::rt
