//===- ExpertRows.cpp - moving token rows to expert rows and back ---------===//

#include "runtime/ExpertRows.h"

#include <torch/autograd.h>

#include <algorithm>

#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/ExpertCombineKernel.h"
#endif

namespace adapt::rt {

namespace {

/// rows = tokens[tokenOfRow]; d tokens = sum over k of d rows[rowOfPair].
struct DispatchTokens : torch::autograd::Function<DispatchTokens> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &tokens,
                               const torch::Tensor &tokenOfRow, const torch::Tensor &rowOfPair) {
    ctx->save_for_backward({rowOfPair});
    ctx->saved_data["tokens"] = tokens.size(0);
#ifdef ADAPT_WITH_CUDA_KERNELS
    if (tokens.is_cuda())
      return cuda::gatherRows(tokens, tokenOfRow);
#endif
    return tokens.index_select(0, tokenOfRow);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor rowOfPair = ctx->get_saved_variables()[0];
    const int64_t tokens = ctx->saved_data["tokens"].toInt();
    const torch::Tensor &g = grads[0];
    const int64_t k = rowOfPair.size(0) / std::max<int64_t>(tokens, 1);
#ifdef ADAPT_WITH_CUDA_KERNELS
    if (g.is_cuda() && tokens > 0) // the combine kernel with unit weights: one pass
      return {cuda::combineRows(g, rowOfPair, torch::Tensor(), k), torch::Tensor(), torch::Tensor()};
#endif
    torch::Tensor summed = g.index_select(0, rowOfPair).view({tokens, k, g.size(1)}).sum(1);
    return {summed, torch::Tensor(), torch::Tensor()};
  }
};

/// picked = rows[rowOfPair] (an injective gather); d rows = d picked copied
/// back to its rows, zeros on the rows no pair owns (padding).
struct GatherOwnedRows : torch::autograd::Function<GatherOwnedRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &rows,
                               const torch::Tensor &rowOfPair) {
    ctx->save_for_backward({rowOfPair});
    ctx->saved_data["rows"] = rows.size(0);
    return rows.index_select(0, rowOfPair);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor rowOfPair = ctx->get_saved_variables()[0];
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const torch::Tensor &g = grads[0];
    torch::Tensor back = torch::zeros({rows, g.size(1)}, g.options()).index_copy_(0, rowOfPair, g);
    return {back, torch::Tensor()};
  }
};

#ifdef ADAPT_WITH_CUDA_KERNELS
/// combineExpertRows on the GPU: gather and weighted sum in one kernel, and
/// one pass for the rows' and the weights' gradients together.
struct CombineRowsKernel : torch::autograd::Function<CombineRowsKernel> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &rows,
                               const torch::Tensor &weights, const torch::Tensor &rowOfPair, int64_t k) {
    ctx->save_for_backward({rows, weights, rowOfPair});
    ctx->saved_data["k"] = k;
    return cuda::combineRows(rows, rowOfPair, weights, k);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &rows = saved[0], &weights = saved[1], &rowOfPair = saved[2];
    const int64_t k = ctx->saved_data["k"].toInt();
    auto [gradRows, gradWeights] =
        cuda::combineRowsBackward(grads[0], rows, rowOfPair, weights, k, ctx->needs_input_grad(1));
    return {gradRows, gradWeights, torch::Tensor(), torch::Tensor()};
  }
};
#endif

} // namespace

torch::Tensor dispatchTokens(const torch::Tensor &tokens, const ExpertGroups &groups) {
  return DispatchTokens::apply(tokens, groups.tokenOfRow, groups.rowOfPair);
}

torch::Tensor combineExpertRows(const torch::Tensor &rows, const ExpertGroups &groups,
                                const torch::Tensor &weights) {
  const int64_t pairs = groups.rowOfPair.size(0), k = groups.pairsPerToken;
#ifdef ADAPT_WITH_CUDA_KERNELS
  if (rows.is_cuda() && weights.defined() && pairs > 0)
    return CombineRowsKernel::apply(rows, weights, groups.rowOfPair, k);
#endif
  torch::Tensor picked = GatherOwnedRows::apply(rows, groups.rowOfPair).view({pairs / k, k, rows.size(1)});
  if (!weights.defined())
    return picked.sum(1);
  torch::Tensor w = weights.to(rows.scalar_type()).view({pairs / k, 1, k});
  return torch::bmm(w, picked).squeeze(1);
}

} // namespace adapt::rt
