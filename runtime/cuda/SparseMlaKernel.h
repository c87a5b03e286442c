//===- SparseMlaKernel.h - sparse MLA's forward in one kernel ---*- C++ -*-===//
//
// DeepSeek sparse attention attends each query's heads to its top-k selected
// latents [c_kv | k_rope] (576 wide) with the first 512 columns as values.
// The composition (runtime/SparseAttention.cpp) gathers [block, k, 576] key
// rows into memory and runs thin batched GEMMs (16 heads per query is a
// 16-row GEMM). This kernel is the forward in one pass, as FlashMLA's sparse
// kernels: a block per (query, 16 heads) gathers 64 selected rows at a time
// into shared memory, computes the logits on tensor cores (mma.sync
// m16n8k16, bf16 in, fp32 accumulation), keeps a running softmax, and adds
// P V into fp32 accumulators; nothing of size k x 576 is written. Logits are
// rounded as the composition rounds them (bf16 product, bf16 scaled), so the
// composition's backward, which recomputes them, sees the same probabilities.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_CUDA_SPARSEMLAKERNEL_H
#define ADAPT_RUNTIME_CUDA_SPARSEMLAKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether sparseLatentForward takes \p q [B, T, H, Dq] and \p keys [B*S,
/// Dq]: CUDA bf16, both contiguous and 16-byte aligned, H a multiple of 16,
/// Dq 576 and \p valueDim 512 (DeepSeek-V3.2's and GLM-5's latents).
bool sparseLatentForwardTakes(const at::Tensor &q, const at::Tensor &keys, int64_t valueDim);

/// out [B, T, H, valueDim] (bf16) and lse [B, T, H] (fp32) of attention of
/// \p q over the rows \p indices [B, T, k] (int64, clamped to \p keyLen - 1,
/// of batch b's rows b * keyLen...) of \p keys, slots where \p valid [B, T,
/// k] (bool) is false left out; logits scale * q . key, values the keys'
/// first valueDim columns.
void sparseLatentForward(const at::Tensor &q, const at::Tensor &keys, const at::Tensor &indices,
                         const at::Tensor &valid, double scale, int64_t keyLen, int64_t valueDim, at::Tensor &out,
                         at::Tensor &lse);

/// The gradients of sparseLatentForward: \p gradQuery [B, T, H, Dq] bf16
/// (written) and the keys' rows added into \p gradKeys [B*S, Dq] fp32 (16-byte
/// atomics), from \p out and \p gradOut [B, T, H, valueDim] bf16 and the
/// forward's \p lse. The same rounding as the composition's backward: logits
/// as the forward, dP = dO . V^T and dS rounded to bf16.
void sparseLatentBackward(const at::Tensor &q, const at::Tensor &keys, const at::Tensor &indices,
                          const at::Tensor &valid, const at::Tensor &out, const at::Tensor &gradOut,
                          const at::Tensor &lse, double scale, int64_t keyLen, at::Tensor &gradQuery,
                          at::Tensor &gradKeys);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_SPARSEMLAKERNEL_H
