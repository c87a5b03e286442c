//===- ExpertCombineKernel.h - experts' rows back to tokens -*- C++ -*-===//
//
// The MoE unpermute and weighted combine as single passes (built where nvcc
// is, ADAPT_WITH_CUDA_KERNELS). runtime/ExpertRows.cpp keeps the LibTorch
// composition (gather, batched GEMM over k) as the CPU path and reference.
// Every (token t, slot j) pair p = t*k + j owns one row rowOfPair[p].
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_EXPERTCOMBINEKERNEL_H
#define ADAPT_RUNTIME_CUDA_EXPERTCOMBINEKERNEL_H

#include <ATen/core/Tensor.h>

#include <utility>

namespace adapt::rt::cuda {

/// y[t] = sum_j w[t, j] * rows[rowOfPair[t*k + j]] for \p rows [R, H]
/// (contiguous), \p rowOfPair [T*k] int64, \p weights [T, k] any float dtype
/// (undefined: all ones); fp32 accumulation, stored in rows' dtype: [T, H].
at::Tensor combineRows(const at::Tensor &rows, const at::Tensor &rowOfPair, const at::Tensor &weights, int64_t k);

/// combineRows's gradient for \p rows: row rowOfPair[p] = w[p] * gradY[p / k],
/// padding rows (owned by no pair) zero: [rows, H] in gradY's dtype.
at::Tensor combineRowsGradRows(const at::Tensor &gradY, const at::Tensor &rowOfPair, const at::Tensor &weights,
                               int64_t k, int64_t rows);

/// combineRows's gradient for the weights: gradW[p] = <gradY[p / k],
/// rows[rowOfPair[p]]> in fp32: [T, k] in the weights' dtype \p dtype.
at::Tensor combineRowsGradWeights(const at::Tensor &gradY, const at::Tensor &rows, const at::Tensor &rowOfPair,
                                  int64_t k, at::ScalarType dtype);

/// tokens[tokenOfRow[r]] for every row r: the dispatch of tokens to expert
/// rows ([R, H] in tokens' dtype); index_select where 16-byte packs do not fit.
at::Tensor gatherRows(const at::Tensor &tokens, const at::Tensor &tokenOfRow);

/// gatherRows written into \p out [R, H], whose rows may be the first H
/// columns of a wider buffer (unit column stride, 16-byte aligned row
/// stride). Returns false, writing nothing, where 16-byte packs do not fit.
bool gatherRowsInto(const at::Tensor &tokens, const at::Tensor &tokenOfRow, at::Tensor out);

/// The gradients of combineRows in one pass over \p gradY: the rows'
/// gradients (w_j g for each pair's row, zeros on unowned rows) and, when
/// \p needWeights, the weights' gradients (g . x_j), as \p weights' dtype.
std::pair<at::Tensor, at::Tensor> combineRowsBackward(const at::Tensor &gradY, const at::Tensor &rows,
                                                      const at::Tensor &rowOfPair, const at::Tensor &weights,
                                                      int64_t k, bool needWeights);

/// sum_c a[r, c] * b[r, c] per row in fp32 ([R]), for contiguous [R, C] a
/// and b of one dtype in 16-byte packs; undefined where they do not fit.
at::Tensor rowDots(const at::Tensor &a, const at::Tensor &b);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_EXPERTCOMBINEKERNEL_H
