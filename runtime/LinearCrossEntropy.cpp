//===- LinearCrossEntropy.cpp - fused, chunked LM head + loss -------------===//
//
// One autograd node: the forward pass walks row chunks, computing each
// chunk's logits, log-sum-exp, loss and (when needed) the gradient of h; the
// backward pass scales that gradient by the incoming scalar.
//
//===----------------------------------------------------------------------===//

#include "runtime/LinearCrossEntropy.h"

#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/CrossEntropyKernel.h"
#endif

#include <ATen/record_function.h>
#include <algorithm>

namespace adapt::rt {

namespace {

constexpr int64_t kIgnoreIndex = -100;

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &h,
                               const torch::Tensor &weight, const torch::Tensor &targets, int64_t chunkRows) {
    RECORD_FUNCTION("adapt::lm_head_loss", c10::ArrayRef<const c10::IValue>{}); // a --profile scope
    const bool wantGrad = h.requires_grad();
    const int64_t rows = h.size(0);
    torch::Tensor loss = torch::zeros({}, h.options().dtype(torch::kFloat32));
    torch::Tensor gradH = wantGrad ? torch::empty_like(h) : torch::Tensor();
    torch::Tensor w = weight.detach(), x = h.detach();
    for (int64_t start = 0; start < rows; start += chunkRows) {
      const int64_t n = std::min(chunkRows, rows - start);
#ifdef ADAPT_WITH_CUDA_KERNELS
      if (x.is_cuda()) { // One kernel per chunk: no fp32 copy of the logits at all.
        torch::Tensor logits = torch::mm(x.narrow(0, start, n), w.t());
        torch::Tensor rowLoss = torch::empty({n}, loss.options());
        cuda::softmaxCrossEntropyRowsInPlace(logits, targets.narrow(0, start, n).contiguous(), rowLoss, wantGrad);
        loss.add_(rowLoss.sum());
        if (wantGrad)
          gradH.narrow(0, start, n).copy_(torch::mm(logits, w));
        continue;
      }
#endif
      torch::Tensor logits = torch::mm(x.narrow(0, start, n), w.t()).to(torch::kFloat32); // [n, V]
      torch::Tensor target = targets.narrow(0, start, n);
      torch::Tensor valid = target.ne(kIgnoreIndex);
      torch::Tensor safe = torch::where(valid, target, torch::zeros_like(target)).unsqueeze(1);
      torch::Tensor lse = logits.logsumexp(1);
      torch::Tensor picked = logits.gather(1, safe).squeeze(1);
      loss.add_(((lse - picked) * valid).sum());
      if (!wantGrad)
        continue;
      // d loss / d logits = softmax - one-hot, on valid rows only; in place.
      torch::Tensor grad = logits.sub_(lse.unsqueeze(1)).exp_();
      grad.scatter_add_(1, safe, torch::full({n, 1}, -1.0f, grad.options()));
      grad.mul_(valid.unsqueeze(1));
      gradH.narrow(0, start, n).copy_(torch::mm(grad.to(w.scalar_type()), w));
    }
    ctx->save_for_backward({gradH});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list gradOutputs) {
    RECORD_FUNCTION("adapt::lm_head_loss", c10::ArrayRef<const c10::IValue>{});
    torch::Tensor gradH = ctx->get_saved_variables()[0];
    torch::Tensor scaled;
    if (gradH.defined())
      scaled = gradH * gradOutputs[0].to(gradH.scalar_type());
    return {scaled, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

int64_t linearCrossEntropyChunkRows(int64_t vocab) {
  constexpr int64_t kChunkFloats = int64_t(1) << 27; // 512 MiB of fp32 logits
  const int64_t rows = kChunkFloats / std::max<int64_t>(vocab, 1);
  return std::max<int64_t>(64, rows / 64 * 64);
}

torch::Tensor linearCrossEntropySum(const torch::Tensor &h, const torch::Tensor &weight,
                                    const torch::Tensor &targets, int64_t chunkRows) {
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1),
              "linearCrossEntropySum: expected h [N, hidden] and weight [vocab, hidden]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0),
              "linearCrossEntropySum: expected one target per row");
  const int64_t chunk = chunkRows > 0 ? chunkRows : linearCrossEntropyChunkRows(weight.size(0));
  return LinearCrossEntropyFunction::apply(h, weight, targets.to(h.device(), torch::kLong), chunk);
}

} // namespace adapt::rt
