//===- FuzzSafetensors.cpp - libFuzzer target for the shard header reader -===//
//
// Feeds arbitrary bytes to the safetensors header parser two ways: as a whole
// file (8-byte length, header, data; the path readSafetensorsHeader takes) and
// as bare header JSON against a roomy and a maximal file size, where offset
// arithmetic is most likely to overflow. Accepted headers are checked against
// the invariants the parser promises, so logic slips crash the fuzzer too.
//
// Build: clang++-19 -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined
//        -I. tests/fuzz/FuzzSafetensors.cpp parser/Safetensors.cpp
//        parser/Manifest.cpp
//
//===----------------------------------------------------------------------===//
#include "parser/Manifest.h"
#include "parser/Safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string_view>

namespace {

/// Aborts unless every promise of parseSafetensorsHeader holds for \p shard.
void checkInvariants(const adapt::ShardHeader &shard) {
  if (shard.fileSize < 8 || shard.fileSize - 8 < shard.headerBytes)
    std::abort();
  uint64_t dataBytes = shard.fileSize - 8 - shard.headerBytes;
  for (const adapt::TensorHeader &t : shard.tensors) {
    int64_t bits = adapt::safetensorsDtypeBits(t.dtype);
    if (bits <= 0 || t.begin > t.end || t.end > dataBytes)
      std::abort();
    for (int64_t dim : t.shape)
      if (dim < 0)
        std::abort();
  }
  // Whatever came out must also make a consistent single-file manifest or a
  // clean error, never a crash.
  adapt::Result<adapt::Manifest> m = adapt::manifestFromShard(shard);
  if (m.ok() && m->tensors.size() != shard.tensors.size())
    std::abort();
}

} // namespace

/// libFuzzer entry point: one input, three parses.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char *>(data), size);
  adapt::Result<adapt::ShardHeader> whole =
      adapt::parseSafetensorsBytes(bytes, "fuzz.safetensors");
  if (whole.ok())
    checkInvariants(whole.value());
  else if (whole.error().message().find('\n') != std::string::npos)
    std::abort(); // Errors are printed as one line.
  for (uint64_t fileSize : {uint64_t(8) + size + 65536,
                            std::numeric_limits<uint64_t>::max()}) {
    adapt::Result<adapt::ShardHeader> header =
        adapt::parseSafetensorsHeader(bytes, fileSize, "fuzz.json");
    if (header.ok())
      checkInvariants(header.value());
  }
  return 0;
}
