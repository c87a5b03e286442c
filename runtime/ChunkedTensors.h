//===- ChunkedTensors.h - [B, H, T, d] tensors as chunks of tokens -*- C++ -*-===//
//
// The chunked delta rules' shared plumbing (runtime/DeltaRuleFunction.cpp,
// runtime/KimiDeltaFunction.cpp): tensors cut into fp32 chunks of c tokens
// [B, H, n, c, d] and back, and the chunk's causal masks.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CHUNKEDTENSORS_H
#define ADAPT_RUNTIME_CHUNKEDTENSORS_H

#include <torch/torch.h>

namespace adapt::rt {

/// x [B, H, T, d] as fp32 chunks [B, H, n, c, d], T padded with zeros.
inline torch::Tensor toChunks(const torch::Tensor &x, int64_t c) {
  const int64_t t = x.size(2), pad = (c - t % c) % c;
  torch::Tensor f = x.to(torch::kFloat32, false, false, at::MemoryFormat::Contiguous);
  if (pad)
    f = torch::constant_pad_nd(f, {0, 0, 0, pad});
  return f.reshape({x.size(0), x.size(1), (t + pad) / c, c, x.size(3)});
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

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_CHUNKEDTENSORS_H
