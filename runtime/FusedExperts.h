//===- FusedExperts.h - routed experts with LoRA folded into the GEMMs -*- C++ -*-===//
//
// The routed experts' MLP (dispatch, gate_up + LoRA, SwiGLU, down + LoRA) as
// one autograd node whose rank-r LoRA terms ride inside the base grouped
// GEMMs instead of running as separate passes over the [rows, width]
// outputs (issue 17). Per expert e, with the rows' inputs x and factors A_e
// [r, in], B_e [out, r] (scale s folded into B):
//
//   forward   y = x W_e^T + (x A_e^T)(s B_e)^T = [x | x A_e^T] [W_e | s B_e]^T
//   backward  dx = dy W_e + (dy s B_e) A_e       = [dy | dy s B_e] [W_e ; A_e]
//
// So each expert's frozen weight lives in a buffer with r spare columns
// (holding s B_e) and r spare rows (holding A_e): [E, out + r, in + r], its
// own view being the top-left [E, out, in]. The producers of the GEMMs'
// inputs (the row gather, SwiGLU forward and backward) write straight into
// buffers with r spare columns, which receive the rank-r products (x A_e^T
// or dy s B_e, [rows, r]). The forward needs no extra pass at all, the
// backward one rank-r add over the narrow [rows, intermediate] gradient.
// K and N grow by r (16 of 2,048 or 768): ~1-3 % more GEMM work in place of
// three read-modify-write passes over [rows, 1,536 or 2,048] tensors.
//
// The GPU's kernels are used where present; the same node runs on the CPU
// with LibTorch ops in their place, so it is checked everywhere against the
// composition (ExpertLinear::forward and gatedActivation), which stays the
// reference and the path of every case this node does not cover.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_FUSEDEXPERTS_H
#define ADAPT_RUNTIME_FUSEDEXPERTS_H

#include "runtime/Layers.h"

namespace adapt::rt {

/// Whether the routed experts of \p f can run as the fused node: both expert
/// projections carry LoRA of one rank (a multiple of 8 up to 32), no expert
/// biases, plain SwiGLU over a concatenated gate/up (no generated
/// activation), no input-scaling router, all experts local, the widths
/// multiples of 8, and a dtype the grouped GEMM runs in on that device.
bool fusedExpertsSupported(const FfnLayer &f);

/// Moves \p f's expert weights into the padded buffers (file comment); the
/// ExpertLinear weights become views of them (values unchanged) and the
/// layer runs the fused node from then on. Returns false, changing nothing,
/// where fusedExpertsSupported does not hold.
bool prepareFusedExperts(FfnLayer &f);

/// Whether prepareFusedExperts has run on \p f.
bool hasFusedExperts(const FfnLayer &f);

/// The routed experts' output [T, hidden] for \p tokens [T, hidden] routed
/// as \p groups with \p weights [T, k]: combineExpertRows(expertDown(SwiGLU(
/// gateUp(dispatchTokens(tokens)))), groups, weights), in the weights' dtype
/// (the layer's). Differentiable in \p tokens, \p weights and the four LoRA
/// factors; the frozen weights get no gradient. The combine is inside the
/// node, so the expert rows are not kept for the weights' gradient
/// (FusedExperts.cpp). Requires hasFusedExperts(f).
torch::Tensor fusedRoutedExperts(const FfnLayer &f, const torch::Tensor &tokens, const ExpertGroups &groups,
                                 const torch::Tensor &weights);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_FUSEDEXPERTS_H
