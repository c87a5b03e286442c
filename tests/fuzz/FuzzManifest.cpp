//===- FuzzManifest.cpp - libFuzzer target for the index reader -----------===//
//
// Feeds arbitrary bytes to parseManifest and checks what it accepts: shards
// sorted and unique, every tensor's shard among them, no empty names, and a
// numbering base that is -1, 0 or 1.
//
// Build: clang++-19 -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined
//        -I. tests/fuzz/FuzzManifest.cpp parser/Manifest.cpp
//        parser/Safetensors.cpp
//
//===----------------------------------------------------------------------===//
#include "parser/Manifest.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

/// libFuzzer entry point: parse one input as an index file.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view json(reinterpret_cast<const char *>(data), size);
  adapt::Result<adapt::Manifest> r = adapt::parseManifest(json, "fuzz.json");
  if (!r.ok()) {
    if (r.error().message().find('\n') != std::string::npos)
      std::abort(); // Errors are printed as one line.
    return 0;
  }
  const adapt::Manifest &m = r.value();
  if (!std::is_sorted(m.shards.begin(), m.shards.end()) ||
      std::adjacent_find(m.shards.begin(), m.shards.end()) != m.shards.end())
    std::abort();
  for (const auto &[tensor, shard] : m.tensors)
    if (tensor.empty() ||
        !std::binary_search(m.shards.begin(), m.shards.end(), shard))
      std::abort();
  if (m.shardNumberBase < -1 || m.shardNumberBase > 1 ||
      (m.shardNumberBase == -1) != (m.declaredShardCount == 0))
    std::abort();
  return 0;
}
