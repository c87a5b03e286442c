//===- Errors.h - the runtime's errors and exit codes ----------*- C++ -*-===//
//
// Every failure the user can cause or must know about is one RuntimeError
// naming the file, the field and what was expected, and carrying the process
// exit code a generated trainer returns for it. The trainer's top level
// prints what() as "error: FILE: FIELD: EXPECTED" and exits with exitCode.
// Header-only and LibTorch-free so every runtime file can include it.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_ERRORS_H
#define ADAPT_RUNTIME_ERRORS_H

#include <cstring>
#include <stdexcept>
#include <string>

namespace adapt::rt {

/// Documented exit codes of a generated trainer (`DIR/train --help` lists
/// them too).
enum RuntimeExitCode : int {
  kExitSuccess = 0,
  kExitInternal = 1,     ///< A LibTorch failure or a bug (out of memory, ...).
  kExitBadInput = 2,     ///< Missing/truncated shard, shape mismatch, bad
                         ///< dataset, token id >= vocab, bad flag.
  kExitCheckFailed = 4,  ///< `--validate`, adapt-op-check: a numerical comparison failed.
  kExitDiverged = 5,     ///< Training diverged: NaN/Inf loss or gradient.
  kExitWriteFailed = 6,  ///< An I/O failure while writing (disk full, ...).
  kExitPeerFailed = 7,   ///< Parallel run: another rank failed, or a collective timed out.
  kExitInterrupted = 130 ///< SIGINT/SIGTERM, after a clean checkpoint.
};

/// One failure: which file, which field (tensor name, JSON path, line, flag),
/// what was expected and what was found, and the exit code it maps to.
struct RuntimeError : std::runtime_error {
  std::string file;     ///< Offending path ("" when no file is involved).
  std::string field;    ///< Tensor name, JSON field, "line 12", "--steps".
  std::string expected; ///< What a valid input has there, and what it had.
  int exitCode;         ///< One of RuntimeExitCode.

  RuntimeError(std::string file, std::string field, std::string expected,
               int exitCode = kExitBadInput)
      : std::runtime_error(format(file, field, expected)), file(std::move(file)),
        field(std::move(field)), expected(std::move(expected)),
        exitCode(exitCode) {}

  /// "FILE: FIELD: EXPECTED", leaving out empty parts; the CLI prefixes
  /// "error: ".
  static std::string format(const std::string &file, const std::string &field,
                            const std::string &expected) {
    std::string out;
    for (const std::string *part : {&file, &field, &expected}) {
      if (part->empty())
        continue;
      if (!out.empty())
        out += ": ";
      out += *part;
    }
    return out;
  }
};

/// A tensor shape as messages print it, "[2, 3]": any range of integers
/// (c10::IntArrayRef, std::vector<int64_t>).
template <typename Shape> std::string formatShape(const Shape &shape) {
  std::string out = "[";
  for (auto dim : shape)
    out += (out.size() > 1 ? ", " : "") + std::to_string(dim);
  return out + "]";
}

/// A bad checkpoint (missing or truncated shard, unknown dtype, a tensor of
/// the wrong shape): always exit code 2. Thrown by the loader and by Model.
struct LoadError : RuntimeError {
  LoadError(std::string file, std::string field, std::string expected)
      : RuntimeError(std::move(file), std::move(field), std::move(expected),
                     kExitBadInput) {}
};

/// Bad user input that is not a checkpoint: dataset, flags, resume state.
inline RuntimeError badInput(std::string file, std::string field,
                             std::string expected) {
  return RuntimeError(std::move(file), std::move(field), std::move(expected),
                      kExitBadInput);
}

/// A failed \p operation ("write", "fsync", "open", ...) on \p path with
/// the errno \p err: \p expectation then the system's reason, exit \p code.
inline RuntimeError ioError(std::string path, std::string operation, const char *expectation, int err,
                           int code) {
  return RuntimeError(std::move(path), std::move(operation), std::string(expectation) + std::strerror(err),
                      code);
}

/// A failed write of \p path during \p operation ("write", "fsync",
/// "rename", ...) with the errno \p err; exit code 6.
inline RuntimeError writeError(std::string path, std::string operation, int err) {
  return ioError(std::move(path), std::move(operation),
                 "expected the write to succeed but it failed: ", err, kExitWriteFailed);
}

/// A failed open/read of \p path (errno \p err) while reading input; exit 2.
inline RuntimeError readError(std::string path, std::string operation, int err) {
  return ioError(std::move(path), std::move(operation), "expected a readable file but: ", err,
                 kExitBadInput);
}

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_ERRORS_H
