//===- Tf32Scope.h - TF32 tensor cores for fp32 GEMMs, scoped ----*- C++ -*-===//
//
// The linear-attention ops compute in fp32; with bf16/fp16 activations on
// the GPU their GEMMs may run on TF32 tensor cores (inputs rounded to
// 2^-11, fp32 accumulation). The global switch cannot stay on: other fp32
// GEMMs of a step (the routers, computed in fp32 as the reference computes
// them) must stay IEEE fp32.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_TF32SCOPE_H
#define ADAPT_RUNTIME_TF32SCOPE_H

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

namespace adapt::rt {

/// Whether \p x is bf16 or fp16: its values are exact in fp32 (so its
/// products with fp32 tensors come out as an fp32 copy's would) and in TF32,
/// the activations for which the linear-attention ops take TF32 GEMMs.
inline bool reducedFloat(const at::Tensor &x) {
  return x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
}

/// Allows TF32 tensor-core GEMMs for fp32 operands while alive (when \p
/// enable), then restores the previous setting.
class Tf32Scope {
public:
  explicit Tf32Scope(bool enable = true) : previous(at::globalContext().allowTF32CuBLAS()) {
    if (enable)
      at::globalContext().setAllowTF32CuBLAS(true);
  }
  ~Tf32Scope() { at::globalContext().setAllowTF32CuBLAS(previous); }
  Tf32Scope(const Tf32Scope &) = delete;
  Tf32Scope &operator=(const Tf32Scope &) = delete;

private:
  bool previous;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_TF32SCOPE_H
