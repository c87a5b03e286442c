//===- ImportOnnx.h - an ONNX graph into the adapt dialect ------*- C++ -*-===//
#ifndef ADAPT_IR_IMPORTONNX_H
#define ADAPT_IR_IMPORTONNX_H

#include "parser/InputError.h"

#include <string>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace adapt {

/// Reads \p path and maps its operators onto library components: matched
/// ones become component ops, the rest `adapt.unmapped` (reported as gaps).
/// \p architecture receives the graph's producer ("ONNX graph" when none),
/// which the gap report names as the model's architecture.
Result<mlir::OwningOpRef<mlir::ModuleOp>>
importOnnxModel(mlir::MLIRContext &context, const std::string &path,
                std::string &architecture);

} // namespace adapt

#endif // ADAPT_IR_IMPORTONNX_H
