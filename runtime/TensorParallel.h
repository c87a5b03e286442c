//===- TensorParallel.h - projections split across a TP group ----*- C++ -*-===//
//
// Tensor parallelism (Megatron's column/row split) for softmax attention and
// dense MLPs. A column-parallel projection holds a slice of the output rows
// (q, k, v: whole heads; gate/up: intermediate channels); its input is the
// full activation, which every TP rank holds, so its backward sums the ranks'
// input gradients. A row-parallel projection (o, down) holds the matching
// input columns; its partial outputs are summed across the group, and its
// bias is added once, after the sum.
//
// LoRA follows the weight: a column-parallel layer keeps A [r, in] whole and
// B's rows of its outputs; a row-parallel layer keeps A's columns of its
// inputs and B [out, r] whole. The whole factor on each rank then receives
// only its part of the gradient, which the trainer sums over the TP group
// (AdapterTensor::tensorPartial), so the adapter math is exact.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TENSORPARALLEL_H
#define ADAPT_RUNTIME_TENSORPARALLEL_H

#include "runtime/Distributed.h"

#include <torch/torch.h>

namespace adapt::rt {

/// How a projection's weight is split across the tensor-parallel group.
enum class TensorSplit {
  None,    ///< Whole on every rank (replicated).
  Columns, ///< Column-parallel: the rows of its outputs (q, k, v, gate, up).
  Rows,    ///< Row-parallel: the columns of its inputs (o, down).
};

/// Identity forward; the backward sums the gradient over GROUP (the input
/// of a column-parallel projection).
torch::Tensor copyToTensorRegion(const torch::Tensor &x, Collectives &group);

/// Sums X over GROUP forward; identity backward (the partial output of a
/// row-parallel projection).
torch::Tensor reduceFromTensorRegion(const torch::Tensor &x, Collectives &group);

/// RMSNorm over a width split across GROUP (a full-width QK norm, lightning
/// attention's output norm): \p x [..., local] is this rank's part and
/// \p weight its part of the weight; the mean of squares is over the whole
/// width (one all-reduce forward, one backward), in fp32 like rmsNorm. With
/// \p zeroCentred the scale is 1 + weight (zeroCentredRmsNorm).
torch::Tensor splitWidthRmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps, bool zeroCentred,
                                Collectives &group);

/// Seconds spent in tensor-parallel all-reduces since the last call (then reset).
double takeTensorParallelSeconds();

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_TENSORPARALLEL_H
