//===- ChunkedTensors.h - [B, H, T, d] tensors as chunks of tokens -*- C++ -*-===//
//
// The chunked delta rules' shared plumbing (runtime/DeltaRuleFunction.cpp,
// runtime/KimiDeltaFunction.cpp): tensors cut into fp32 chunks of c tokens
// [B, H, n, c, d] and back, the chunk's causal masks, and the state's
// recurrence over the chunks forward and backward (one batched GEMM per
// chunk, given each chunk's transition M = diag(decay) - Kd^T W).
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CHUNKEDTENSORS_H
#define ADAPT_RUNTIME_CHUNKEDTENSORS_H

#include <torch/torch.h>
#ifdef ADAPT_WITH_CUDA_KERNELS
#include "runtime/cuda/DeltaRuleKernel.h"
#endif

#include <tuple>
#include <vector>

namespace adapt::rt {

/// x [B, H, T, d] as chunks [B, H, n, c, d] in \p dtype (fp32 unless
/// given), T padded with zeros.
inline torch::Tensor toChunks(const torch::Tensor &x, int64_t c, torch::ScalarType dtype = torch::kFloat32) {
  const int64_t t = x.size(2), pad = (c - t % c) % c;
  torch::Tensor f = x.to(dtype, false, false, at::MemoryFormat::Contiguous);
  if (pad)
    f = torch::constant_pad_nd(f, {0, 0, 0, pad});
  return f.reshape({x.size(0), x.size(1), (t + pad) / c, c, x.size(3)});
}

/// toChunks(x, c) * scale in one pass over x (no fp32 copy to scale
/// after): each element float(x) * float(scale), as the copy times the
/// scalar would give.
inline torch::Tensor scaledChunks(const torch::Tensor &x, int64_t c, double scale) {
  const int64_t t = x.size(2);
  if (t % c != 0)
    return toChunks(x, c) * scale;
  torch::Tensor out = torch::empty(x.sizes(), x.options().dtype(torch::kFloat32));
  // A one-element fp32 tensor, not a scalar: it makes the product's type fp32.
  torch::mul_out(out, x, torch::full({1}, static_cast<float>(scale), out.options()));
  return out.view({x.size(0), x.size(1), t / c, c, x.size(3)});
}

/// Chunks [B, H, n, c, d] back to [B, H, T, d] in \p dtype.
inline torch::Tensor fromChunks(const torch::Tensor &x, int64_t t, torch::ScalarType dtype) {
  return x.reshape({x.size(0), x.size(1), x.size(2) * x.size(3), x.size(4)}).narrow(2, 0, t).to(dtype);
}

/// \p x with its last two dimensions swapped.
inline torch::Tensor transposed(const torch::Tensor &x) { return x.transpose(-1, -2); }

/// The chunk's lower-triangular masks: inclusive (t >= i) and strict (t > i).
struct Masks {
  torch::Tensor inclusive, strict;
  Masks(int64_t c, const torch::Device &device) {
    torch::Tensor ones = torch::ones({c, c}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    inclusive = ones.tril();
    strict = ones.tril(-1);
  }
};

/// The states entering each chunk [b, h, n, dk, dv] and the last one [b·h,
/// dk, dv], from \p state [b·h, dk, dv]: S_{i+1} = M_i S_i + Kd_i^T U_i, with
/// \p transition M [b, h, n, dk, dk] and \p written Kd^T U [b, h, n, dk, dv].
inline std::pair<torch::Tensor, torch::Tensor> chunkStates(const torch::Tensor &transition,
                                                           const torch::Tensor &written, torch::Tensor state) {
  const int64_t b = written.size(0), h = written.size(1), n = written.size(2), dk = written.size(3),
                dv = written.size(4);
  const std::vector<torch::Tensor> steps = transition.reshape({b * h, n, dk, dk}).unbind(1),
                                   adds = written.reshape({b * h, n, dk, dv}).unbind(1);
  // unbind, not select: select's backward writes a zero tensor of the whole
  // sequence per chunk (O(T^2 / C) work); unbind's stacks the chunks once.
  std::vector<torch::Tensor> entering;
  entering.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    entering.push_back(state);
    state = torch::baddbmm(adds[i], steps[i], state);
  }
  return {torch::stack(entering, 1).view({b, h, n, dk, dv}), state};
}

/// The state's gradient through the chunks, last to first: {dS' of each
/// chunk [b, h, n, dk, dv], dV_new, dS of the first chunk [b·h, dk, dv]},
/// from \p localNew = P^T dO and \p last, the gradient of S_T [b·h, dk, dv].
/// dS = M^T dS' + (Qd^T dO - W^T P^T dO): one batched GEMM per chunk, with
/// everything that does not depend on dS' batched before.
inline std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>
stateGradients(const torch::Tensor &transition, const torch::Tensor &keysToEnd, const torch::Tensor &w,
               const torch::Tensor &queryDecayed, const torch::Tensor &dOut, const torch::Tensor &localNew,
               const torch::Tensor &last) {
  const int64_t b = w.size(0), h = w.size(1), n = w.size(2), dk = w.size(4), dv = dOut.size(4);
  const std::vector<torch::Tensor> stepsT = transposed(transition).reshape({b * h, n, dk, dk}).unbind(1);
  const std::vector<torch::Tensor> adds =
      (torch::matmul(transposed(queryDecayed), dOut) - torch::matmul(transposed(w), localNew))
          .reshape({b * h, n, dk, dv})
          .unbind(1);
  std::vector<torch::Tensor> leaving(n);
  torch::Tensor ds = last;
  for (int64_t i = n - 1; i >= 0; --i) {
    leaving[i] = ds;
    ds = torch::baddbmm(adds[i], stepsT[i], ds);
  }
  torch::Tensor dLeaving = torch::stack(leaving, 1).view({b, h, n, dk, dv});
  return {dLeaving, localNew + torch::matmul(keysToEnd, dLeaving), ds};
}

#ifdef ADAPT_WITH_CUDA_KERNELS
/// stateGradients as one serial kernel (cuda::deltaRuleStateBackward, d 128,
/// chunk 64; the operands go in as bf16 rows): \p decays is G per token
/// [b, h, n, c, 1], or with \p perChannel each chunk's last G per key
/// channel [b, h, n, 1, dk]. Returns the kernel's own dS' [b, h, n, dk, dv]
/// and dV_new [b, h, n, c, dv] (bf16 under leanBackward(), else fp32) and dS
/// of the first state (fp32 [b·h, dk, dv]), for a kernel that reads them.
inline cuda::DeltaRuleStateGrads stateGradientsOnGpuRaw(const torch::Tensor &keysToEnd, const torch::Tensor &w,
                                                        const torch::Tensor &queryDecayed, const torch::Tensor &dOut,
                                                        const torch::Tensor &localNew, const torch::Tensor &decays,
                                                        const torch::Tensor &last, bool perChannel) {
  const int64_t b = w.size(0), h = w.size(1), n = w.size(2), c = w.size(3), dk = w.size(4), dv = dOut.size(4);
  auto rows = [&](const torch::Tensor &x) {
    return x.to(torch::kBFloat16).contiguous().view({b * h, n * c, x.size(-1)});
  };
  cuda::DeltaRuleStateGrads r = cuda::deltaRuleStateBackward(
      rows(keysToEnd), rows(queryDecayed), rows(w), rows(dOut), localNew.contiguous().view({b * h, n * c, dv}),
      decays.contiguous().view({b * h, -1}), last.contiguous(), perChannel);
  r.leaving = r.leaving.view({b, h, n, dk, dv});
  r.newValues = r.newValues.view({b, h, n, c, dv});
  return r;
}

/// stateGradientsOnGpuRaw's results in fp32: what stateGradients returns.
inline std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>
stateGradientsOnGpu(const torch::Tensor &keysToEnd, const torch::Tensor &w, const torch::Tensor &queryDecayed,
                    const torch::Tensor &dOut, const torch::Tensor &localNew, const torch::Tensor &decays,
                    const torch::Tensor &last, bool perChannel) {
  cuda::DeltaRuleStateGrads r =
      stateGradientsOnGpuRaw(keysToEnd, w, queryDecayed, dOut, localNew, decays, last, perChannel);
  return {r.leaving.to(torch::kFloat32), r.newValues.to(torch::kFloat32), r.initial};
}
#endif

/// The log decays' gradient [b, h, n, c, G] from \p dCum, the gradient of
/// their cumulative sums G within each chunk, and \p dLastCum [b, h, n, 1, G],
/// the extra gradient of the chunk's last G: dg_t = sum over t' >= t.
inline torch::Tensor decayGradient(torch::Tensor dCum, const torch::Tensor &dLastCum) {
  dCum.narrow(3, dCum.size(3) - 1, 1).add_(dLastCum);
  return dCum.flip(3).cumsum(3).flip(3);
}

/// What a delta rule node's forward keeps for its backward besides tensors:
/// the token count \p t, the inputs' dtypes (q, k, v, decay, beta, state:
/// the gradients go back in them), the TF32 flag and the chunk size.
inline void saveDeltaRuleShape(torch::autograd::AutogradContext *ctx, int64_t t,
                               std::initializer_list<torch::Tensor> inputs, bool tf32, int64_t chunk) {
  std::vector<int64_t> dtypes;
  for (const torch::Tensor &x : inputs)
    dtypes.push_back(int64_t(x.scalar_type()));
  ctx->saved_data["t"] = t;
  ctx->saved_data["dtypes"] = dtypes;
  ctx->saved_data["tf32"] = tf32;
  ctx->saved_data["chunk"] = chunk;
}

/// A delta rule node's backward result: the chunked gradients of q, k, v,
/// the decay ([.., 1] per head is squeezed), beta, and the initial state
/// [b·h, dk, dv], each in its input's dtype (\p dtypes, as saved by the
/// forward), for a sequence of \p t tokens; none for the chunk size and flag.
inline torch::autograd::variable_list chunkedGradients(const torch::Tensor &dq, const torch::Tensor &dKey,
                                                       const torch::Tensor &dValue, const torch::Tensor &dDecay,
                                                       const torch::Tensor &dBeta, const torch::Tensor &dState,
                                                       int64_t t, const std::vector<int64_t> &dtypes) {
  auto type = [&](int i) { return static_cast<torch::ScalarType>(dtypes[i]); };
  torch::Tensor decay = fromChunks(dDecay, t, type(3));
  return {fromChunks(dq, t, type(0)),
          fromChunks(dKey, t, type(1)),
          fromChunks(dValue, t, type(2)),
          dDecay.size(-1) == 1 ? decay.squeeze(-1) : decay,
          fromChunks(dBeta, t, type(4)).squeeze(-1),
          dState.view({dq.size(0), dq.size(1), dq.size(4), dValue.size(4)}).to(type(5)),
          torch::Tensor(),
          torch::Tensor()};
}

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_CHUNKEDTENSORS_H
