//===- ImportModel.h - ModelSpec into the adapt dialect ---------*- C++ -*-===//
#ifndef ADAPT_IR_IMPORTMODEL_H
#define ADAPT_IR_IMPORTMODEL_H

#include "models/WeightSchema.h"
#include "parser/ModelSpec.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace adapt {

/// Builds one `adapt.model` from the normalised config and the components
/// the weight schema declared for it: weights as symbols, components as a
/// dataflow graph with residual adds.
mlir::OwningOpRef<mlir::ModuleOp>
importModel(mlir::MLIRContext &context, const ModelSpec &spec,
            const std::vector<ComponentDecl> &components);

} // namespace adapt

#endif // ADAPT_IR_IMPORTMODEL_H
