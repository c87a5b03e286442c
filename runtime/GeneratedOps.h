//===- GeneratedOps.h - approved generated operators in a trainer -*- C++ -*-===//
//
// `adapt generate` asks an LLM for operators the library lacks; `adapt review
// --approve` records a person's approval of exactly the bytes they saw, and
// `adapt review --export` writes a registry entry naming the source and its
// SHA-256. `adapt build --registry` checks the hash again, copies the source
// into the trainer project (candidates/<symbol>.cpp, compiled with
// adapt_candidate renamed to the symbol) and generates generated_ops.cpp,
// which registers it here before main runs. A layer uses it by naming its
// component (FfnDef::generatedRouter).
//
// The ABI is the op stage's (docs/agent.md): one function of the inputs and
// the op's numeric parameters, autograd doing the backward.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_GENERATEDOPS_H
#define ADAPT_RUNTIME_GENERATEDOPS_H

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace adapt::rt {

/// The candidate signature every generated operator implements.
using GeneratedOpFn = torch::Tensor (*)(const std::vector<torch::Tensor> &inputs,
                                        const std::map<std::string, double> &params);

/// One approved generated operator compiled into this program.
struct GeneratedOp {
  std::string component;  ///< The gaps.json component it closes.
  std::string task;       ///< Op-stage task it passed, e.g. "moe_routing".
  std::string sha256;     ///< SHA-256 of the approved source file.
  std::string approvedBy; ///< Who approved it (adapt review).
  GeneratedOpFn fn = nullptr;
};

/// Registers \p op (from generated_ops.cpp's static initialiser); returns true
/// so it can initialise a static.
bool registerGeneratedOp(const GeneratedOp &op);

/// The operator registered for \p component; a RuntimeError naming the
/// component when the trainer was built without it.
const GeneratedOp &generatedOp(const std::string &component);

/// Every registered operator, in component order (the trainer logs them).
std::vector<GeneratedOp> generatedOps();

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_GENERATEDOPS_H
