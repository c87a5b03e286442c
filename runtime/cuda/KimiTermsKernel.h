//===- KimiTermsKernel.h - Kimi's backward terms in one pass -----*- C++ -*-===//
//
// The start of Kimi delta attention's backward (runtime/KimiDeltaFunction.cpp)
// derives six fp32 chunk tensors [b, h, n, 64, 128] from q, k, beta and the
// chunk's cumulative log decays G: e^G, e^{G_last - G}, k b, k b e^G,
// k e^{G_last - G} and q e^G. LibTorch does that in nine elementwise passes
// (two exponentials, seven products, each writing its own tensor and most
// reading two): at 1 x 32 heads x 8K, ~1 ms of the 11.3 ms step on an H100
// (session 48's profile). One kernel reads q, k, beta and G once and writes
// the four products, 16 bytes an access (e^G and e^{G_last - G} themselves
// only the LibTorch tail reads; since session 49 they are left to it, which
// spares two [.., 64, 128] fp32 writes and their memory). The default since the kimi_delta op checks
// passed with it on an H100 (session 49: bf16 3.5e-3, fp32 1.16e-6; KDA
// forward + backward 11.48 -> 11.01 ms at 8K, 46.37 -> 45.30 at 32K);
// ADAPT_KIMI_FUSED_TERMS=0 keeps LibTorch's passes.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_KIMITERMSKERNEL_H
#define ADAPT_RUNTIME_CUDA_KIMITERMSKERNEL_H

#include <ATen/core/Tensor.h>

namespace adapt::rt::cuda {

/// Whether the Kimi node's backward derives its terms with the kernel
/// (unless ADAPT_KIMI_FUSED_TERMS=0).
bool kimiFusedTermsEnabled();

/// Whether the kernel takes these: CUDA contiguous \p query and \p key (both
/// fp32 or both bf16) and fp32 \p cum alike [.., c, d] with d a multiple of
/// 4, \p beta fp32 [.., c, 1].
bool kimiFusedTermsTake(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                        const at::Tensor &cum);

/// The terms, shaped like \p key: fp32, but for the decayed keys and
/// queries when asked for in bf16.
/// e^G and e^{G_last - G} themselves are not among them: only the backward's
/// LibTorch tail reads them, and the tail kernel derives its own.
struct KimiTermTensors {
  at::Tensor keysBeta;     ///< k b (undefined from bf16 q and k: its one reader then forms it)
  at::Tensor keysWeighted; ///< (k b) e^G
  at::Tensor keysToEnd;    ///< k e^{G_last - G}, G_last the chunk's last row (fp32 or bf16)
  at::Tensor queryDecayed; ///< q e^G (fp32 or bf16)
};

/// The terms of \p query, \p key, \p beta and \p cum in one pass (each
/// product in the composition's order, exponentials as torch.exp's expf).
/// With \p bf16Decayed, k e^{G_last - G} and q e^G are written in bf16,
/// rounded as .to(kBFloat16) rounds them: where only the state pass reads
/// them (it takes bf16 operands), that spares two fp32 writes and the two
/// casts after them. \p query and \p key may be the node's bf16 inputs
/// themselves (chunked views): the kernel widens them as it reads, q times
/// \p queryScale (fp32 q arrives scaled), each product as the fp32 copies'
/// (so two [.., c, d] fp32 copies are never made), and leaves k b to the
/// paired score gradients, its one reader, which form it likewise.
KimiTermTensors kimiFusedTerms(const at::Tensor &query, const at::Tensor &key, const at::Tensor &beta,
                               const at::Tensor &cum, bool bf16Decayed = false, double queryScale = 1.0);

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_KIMITERMSKERNEL_H
