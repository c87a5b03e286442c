//===- DeltaRuleKernel.h - the chunked delta rule's serial part -*- C++ -*-===//
//
// The recurrence over chunks of the chunked gated delta rule
// (runtime/LinearAttention.cpp's chunkRecurrenceForward and Backward, which
// stay the CPU path and the reference):
//   U_n = V_n - R_n S_n,  O_n = Q_n S_n + A_n U_n,  S_{n+1} = diag(d_n) S_n + W_n^T U_n.
// LibTorch runs it as a few small kernels per 64-token chunk, forward and
// ~15 backward, serially: launch-bound at every length. Here one block per
// (batch, head, 32 value columns) keeps its slice of the state in shared
// memory and walks every chunk in one launch, forward and backward. The
// columns of the state are independent, so blocks never talk; the input
// gradients that sum over value columns (dR, dQ, dW, dA, dd) are written per
// column tile and summed after the kernel (deterministic, no atomics). fp32
// throughout, as the composition.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_DELTARULEKERNEL_H
#define ADAPT_RUNTIME_CUDA_DELTARULEKERNEL_H

#include <ATen/core/Tensor.h>

#include <vector>

namespace adapt::rt::cuda {

/// Whether the kernels take these operands: CUDA fp32, chunks of at most 64
/// tokens and key widths of at most 256 (the state slice and the chunk's
/// rows fit in shared memory).
bool deltaRecurrenceFits(const at::Tensor &values, const at::Tensor &reads);

/// {O [b, h, n, c, dv], the entering states [b, h, n, dk, dv], S_N [b, h, dk, dv]}
/// from V [b, h, n, c, dv], R, Q, W [b, h, n, c, dk], A [b, h, n, c, c],
/// d [b, h, n, G] and S_0 [b, h, dk, dv]; all contiguous fp32.
std::vector<at::Tensor> deltaRecurrenceForward(const at::Tensor &values, const at::Tensor &reads,
                                               const at::Tensor &queries, const at::Tensor &scores,
                                               const at::Tensor &decays, const at::Tensor &writes,
                                               const at::Tensor &state0);

/// {dV, dR, dQ, dA, dd, dW, dS_0} from the forward's inputs, its saved
/// entering \p states and the gradients of O and S_N (contiguous fp32).
std::vector<at::Tensor> deltaRecurrenceBackward(const at::Tensor &values, const at::Tensor &reads,
                                                const at::Tensor &queries, const at::Tensor &scores,
                                                const at::Tensor &decays, const at::Tensor &writes,
                                                const at::Tensor &states, const at::Tensor &gradOut,
                                                const at::Tensor &gradFinal);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_DELTARULEKERNEL_H
