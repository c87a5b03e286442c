//===- EmitTrainer.h - a LoRA training program from the IR ------*- C++ -*-===//
//
// Turns an analysed, LoRA-injected `adapt.model` into a small C++ project:
// model.cpp (one function filling the runtime's ModelDef, runtime/ModelDef.h,
// plus main calling adapt::rt::trainMain), CMakeLists.txt and README.md. The
// output is a pure function of the IR and the options: no timestamps, no
// paths but the model folder, numbers printed so they read back exactly.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_CODEGEN_EMITTRAINER_H
#define ADAPT_CODEGEN_EMITTRAINER_H

#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace adapt {

/// What the generated project needs besides the IR.
/// An approved generated operator to compile into the trainer (adapt review
/// --export, then adapt build --registry; see runtime/GeneratedOps.h).
struct GeneratedOpUse {
  std::string component;  ///< gaps.json component id it closes.
  std::string task;       ///< Op-stage task it passed, e.g. "moe_routing".
  std::string field;      ///< LayerDef field naming it, e.g. "ffn.generatedRouter".
  std::string symbol;     ///< C identifier the candidate's entry is renamed to.
  bool cuda = false;      ///< A .cu source (nvcc; runs with --device cuda only).
  std::string source;     ///< The approved source, byte for byte.
  std::string sha256;     ///< Of `source`, as approved.
  std::string approvedBy;
  std::vector<int64_t> layers; ///< Decoder layers whose component it is.
};

struct TrainerOptions {
  /// The model folder relative to the generated project's folder (the
  /// trainer's default --model, made absolute by the project's CMakeLists.txt
  /// at build time): no absolute path is written into the project, so it
  /// builds and runs wherever project and model move together.
  std::string modelDir;
  std::vector<GeneratedOpUse> generatedOps;
};

/// One file of the generated project, relative to its folder.
struct GeneratedFile {
  std::string name;
  std::string contents;
};

/// Emits the project for the one adapt.model in \p module. Fails (false,
/// \p error says why) when the model has a part the ModelDef cannot express
/// (linear or sparse attention, an attention output gate, a non-SiLU MLP).
bool emitTrainer(mlir::ModuleOp module, const TrainerOptions &options,
                 std::vector<GeneratedFile> &files, std::string &error);

/// A double as the shortest C++ literal that reads back to the same value.
std::string formatDouble(double value);

} // namespace adapt

#endif // ADAPT_CODEGEN_EMITTRAINER_H
