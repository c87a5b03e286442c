//===- adapt-opt.cpp - round-trip the adapt dialect and run its passes ----===//
//
// Registers only the adapt dialect (and builtin), so the tool stays small.
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"
#include "passes/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  adapt::registerAdaptPassesAndPipelines();
  mlir::DialectRegistry registry;
  registry.insert<adapt::AdaptDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "adapt optimizer driver\n", registry));
}
