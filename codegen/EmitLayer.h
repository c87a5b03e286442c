//===- EmitLayer.h - one decoder layer of a generated trainer -*- C++ -*-===//
//
// Internal to codegen/: the text helpers both halves of the emitter use, and
// the writer of one decoder layer's ModelDef statements (EmitLayer.cpp).
// EmitTrainer.cpp gathers the model's ops, groups identical layers into
// helpers and prints model.cpp and the project files around them.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_CODEGEN_EMITLAYER_H
#define ADAPT_CODEGEN_EMITLAYER_H

#include "mlir/IR/Operation.h"
#include "mlir/IR/SymbolTable.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace adapt::codegen {

/// \p text as a C++ string literal (quotes, backslashes and control
/// characters escaped).
std::string quote(const std::string &text);
/// An integer as C++ source.
std::string formatInt(int64_t value);
/// "0-2, 5, 7-9"; a stride as "1, 5, ..., 45".
std::string formatRanges(const std::vector<int64_t> &layers);

/// The ops of one decoder layer.
struct LayerOps {
  int64_t index = 0;
  mlir::Operation *mixer = nullptr;
  mlir::Operation *ffn = nullptr;
  std::string inputNorm, postAttentionNorm;
};

/// One weight an op reads: (IR role, checkpoint name).
using RoleName = std::pair<std::string, std::string>;

/// The weights \p op reads: (IR role, checkpoint name), in its order.
std::vector<RoleName> weightsOf(mlir::Operation *op, mlir::SymbolTable &symbols);

/// One decoder layer's ModelDef statements, as a helper function's body.
struct LayerText {
  std::string body;    ///< The statements (identical layers share them).
  std::string shape;   ///< "sliding" / "chunked" / "nope" / "" + "moe" / "dense".
  std::string summary; ///< One line for model.cpp's comment.
};

/// Writes \p layer's statements for \p family; false (\p error says why)
/// when ModelDef cannot express a part of it.
bool emitLayer(const LayerOps &layer, mlir::SymbolTable &symbols, const std::string &family, LayerText &out,
               std::string &error);

} // namespace adapt::codegen

#endif // ADAPT_CODEGEN_EMITLAYER_H
