//===- Sha256.h - SHA-256 of bytes and files ------------------*- C++ -*-===//
//
// Validation records name the exact inputs and code they were made from by
// SHA-256 (FIPS 180-4), so a fixture never meets other weights and a record
// never vouches for other code. Plain C++, no LibTorch.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_SHA256_H
#define ADAPT_RUNTIME_SHA256_H

#include <cstdint>
#include <string>
#include <string_view>

namespace adapt::rt {

/// Incremental SHA-256.
class Sha256 {
public:
  Sha256();
  void update(const void *data, size_t size);
  /// The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex();

private:
  void block(const uint8_t *p);
  uint32_t state[8];
  uint8_t buffer[64];
  size_t buffered = 0;
  uint64_t length = 0;
};

/// SHA-256 of \p bytes, hex.
std::string sha256Hex(std::string_view bytes);
/// SHA-256 of the file at \p path, hex; throws RuntimeError (exit 2) when it
/// cannot be read.
std::string sha256File(const std::string &path);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_SHA256_H
