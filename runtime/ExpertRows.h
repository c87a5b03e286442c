//===- ExpertRows.h - moving token rows to expert rows and back -*- C++ -*-===//
//
// The two data movements around the grouped expert GEMMs, written so that
// neither direction needs atomic adds: every (token, slot) pair owns exactly
// one expert row (ExpertGroups::rowOfPair), so a token's k rows are summed
// by a gather and a reduction over k, and an expert row's gradient is copied
// from the one pair that owns it. LibTorch's index_select / index_add pair
// scatters with atomics instead (bf16 atomics on the GPU: the largest
// non-GEMM cost of an MoE layer before this, docs/performance.md).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_EXPERTROWS_H
#define ADAPT_RUNTIME_EXPERTROWS_H

#include "runtime/Ops.h"

namespace adapt::rt {

/// The expert rows of \p tokens [T, H]: row r is tokens[groups.tokenOfRow[r]]
/// (padding rows repeat token 0). Backward sums each token's k rows through
/// groups.rowOfPair, without atomics.
torch::Tensor dispatchTokens(const torch::Tensor &tokens, const ExpertGroups &groups);

/// Each token's output from its experts' rows \p rows [R, H]:
/// y[t] = sum_j weights[t, j] * rows[rowOfPair[t * k + j]], one batched GEMM
/// over k (fp32 accumulation); \p weights [T, k] (cast to the rows' dtype),
/// or undefined for a plain sum. Padding rows are never read, and get a zero
/// gradient; the others get theirs by a copy, without atomics.
torch::Tensor combineExpertRows(const torch::Tensor &rows, const ExpertGroups &groups,
                                const torch::Tensor &weights);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_EXPERTROWS_H
