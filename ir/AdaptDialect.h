//===- AdaptDialect.h - the adapt dialect -----------------------*- C++ -*-===//
#ifndef ADAPT_IR_ADAPTDIALECT_H
#define ADAPT_IR_ADAPTDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "ir/AdaptDialect.h.inc"
#include "ir/AdaptEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "ir/AdaptAttrs.h.inc"

#define GET_OP_CLASSES
#include "ir/AdaptOps.h.inc"

namespace adapt {

/// The weights a component refers to, keyed by their role ("q_proj").
/// Fails (with a diagnostic on \p op) when a symbol is not an adapt.weight.
mlir::FailureOr<llvm::StringMap<WeightOp>>
lookupComponentWeights(mlir::Operation *op, mlir::ArrayAttr weights,
                       mlir::SymbolTableCollection &symbols);

/// Checks that the weight with \p role, when present, has \p expected shape
/// (kDynamic entries match anything); emits an op error naming both shapes.
mlir::LogicalResult expectWeightShape(mlir::Operation *op,
                                      const llvm::StringMap<WeightOp> &weights,
                                      llvm::StringRef role,
                                      llvm::ArrayRef<int64_t> expected);

/// A weight role and the shape an op's attributes imply for it.
struct ExpectedWeightShape {
  llvm::StringRef role;
  llvm::SmallVector<int64_t, 4> shape;
};

/// expectWeightShape for each of \p expected in turn, stopping at the first
/// mismatch: a component op lists its weights' shapes as one table and reports
/// one error at most.
mlir::LogicalResult expectWeightShapes(mlir::Operation *op,
                                       const llvm::StringMap<WeightOp> &weights,
                                       llvm::ArrayRef<ExpectedWeightShape> expected);

/// Hidden size of a component: the last dimension of its first input.
int64_t componentHidden(mlir::Operation *op);

} // namespace adapt

#endif // ADAPT_IR_ADAPTDIALECT_H
