//===- PassInput.h - what a pass reads besides the IR -----------*- C++ -*-===//
//
// Passes read a file besides the IR (the manifest, the op registry): the
// pipeline hands it over already parsed, and adapt-opt names it by a pass
// option instead. One rule for both, so every pass reads its input alike.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PASSES_PASSINPUT_H
#define ADAPT_PASSES_PASSINPUT_H

#include "parser/InputError.h"

#include "mlir/IR/Operation.h"
#include "mlir/Support/LogicalResult.h"

#include <optional>
#include <string>

namespace adapt {

/// The input a pass works on: \p given when the pipeline handed one over,
/// else the file \p path names, parsed by \p read into \p owned; null when
/// there is neither. A read error is emitted on \p op and is a failure.
template <typename T, typename Reader>
mlir::FailureOr<const T *> passInput(const T *given, const std::string &path,
                                     std::optional<T> &owned, Reader read,
                                     mlir::Operation *op) {
  if (given || path.empty())
    return given;
  Result<T> parsed = read(path);
  if (!parsed) {
    op->emitError(parsed.error().message());
    return mlir::failure();
  }
  owned = std::move(parsed.value());
  return &*owned;
}

} // namespace adapt

#endif // ADAPT_PASSES_PASSINPUT_H
