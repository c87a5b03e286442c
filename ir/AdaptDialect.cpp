//===- AdaptDialect.cpp - dialect registration and shared verifiers -------===//

#include "ir/AdaptDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;

namespace adapt {

void AdaptDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "ir/AdaptAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "ir/AdaptOps.cpp.inc"
      >();
}

FailureOr<llvm::StringMap<WeightOp>>
lookupComponentWeights(Operation *op, ArrayAttr weights,
                       SymbolTableCollection &symbols) {
  llvm::StringMap<WeightOp> byRole;
  Operation *model = op->getParentOp();
  for (Attribute attr : weights) {
    auto ref = llvm::cast<FlatSymbolRefAttr>(attr);
    auto weight = symbols.lookupSymbolIn<WeightOp>(model, ref);
    if (!weight)
      return op->emitOpError() << "refers to " << ref
                               << ", which is not an adapt.weight of the model";
    byRole[weight.getRole()] = weight;
  }
  return byRole;
}

LogicalResult expectWeightShape(Operation *op,
                                const llvm::StringMap<WeightOp> &weights,
                                StringRef role, ArrayRef<int64_t> expected) {
  auto it = weights.find(role);
  if (it == weights.end())
    return success();
  WeightOp weight = it->second;
  auto type = llvm::cast<RankedTensorType>(weight.getType());
  ArrayRef<int64_t> shape = type.getShape();
  bool ok = shape.size() == expected.size();
  for (size_t i = 0; ok && i < shape.size(); ++i)
    ok = expected[i] == ShapedType::kDynamic || expected[i] == shape[i];
  if (ok)
    return success();
  auto diag = op->emitOpError() << "weight '" << role << "' ("
                                << weight.getSymName() << ") has shape [";
  llvm::interleaveComma(shape, diag);
  diag << "] but the op's attributes imply [";
  llvm::interleave(
      expected, diag,
      [&](int64_t d) {
        if (d == ShapedType::kDynamic)
          diag << "?";
        else
          diag << d;
      },
      ", ");
  return diag << "]";
}

LogicalResult expectWeightShapes(Operation *op, const llvm::StringMap<WeightOp> &weights,
                                 ArrayRef<ExpectedWeightShape> expected) {
  for (const ExpectedWeightShape &weight : expected)
    if (failed(expectWeightShape(op, weights, weight.role, weight.shape)))
      return failure();
  return success();
}

int64_t componentHidden(Operation *op) {
  if (op->getNumOperands() == 0)
    return ShapedType::kDynamic;
  auto type = llvm::dyn_cast<RankedTensorType>(op->getOperand(0).getType());
  if (!type || type.getRank() == 0)
    return ShapedType::kDynamic;
  return type.getShape().back();
}

//===----------------------------------------------------------------------===//
// WeightOp
//===----------------------------------------------------------------------===//

int64_t WeightOp::getNumElements() {
  return llvm::cast<RankedTensorType>(getType()).getNumElements();
}

LogicalResult WeightOp::verify() {
  auto type = llvm::cast<RankedTensorType>(getType());
  if (!type.hasStaticShape())
    return emitOpError("weight shapes must be static");
  if (getPerExpert()) {
    if (!getRouted() || type.getRank() < 2)
      return emitOpError("a per-expert weight must be routed and lead with "
                         "the expert dimension");
    if (!getSymName().contains("{e}"))
      return emitOpError("a per-expert weight's name must contain {e}");
  }
  return success();
}

} // namespace adapt

#include "ir/AdaptDialect.cpp.inc"
#include "ir/AdaptEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "ir/AdaptAttrs.cpp.inc"
#define GET_OP_CLASSES
#include "ir/AdaptOps.cpp.inc"
