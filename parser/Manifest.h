//===- Manifest.h - read model.safetensors.index.json -----------*- C++ -*-===//
//
// A sharded Hugging Face checkpoint lists, in `model.safetensors.index.json`,
// which shard file holds each tensor (`weight_map`) plus a little metadata
// (`total_size`, sometimes more). The manifest is the front end's table of
// contents: it is read before any shard, so it must be fast on indexes with
// hundreds of thousands of tensors and must reject anything that would send
// later stages to the wrong file (path separators, `..`, inconsistent shard
// numbering). A single-file checkpoint gets an equivalent Manifest from its
// shard header via manifestFromShard.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_MANIFEST_H
#define ADAPT_PARSER_MANIFEST_H

#include "parser/InputError.h"
#include "parser/Safetensors.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace adapt {

/// Largest index file readManifest accepts, in bytes. Real indexes are tens
/// of MB at most; the cap bounds memory on a wrong path such as /dev/zero.
constexpr uint64_t kMaxManifestBytes = 1ull << 30;

/// The contents of one `model.safetensors.index.json`, validated.
struct Manifest {
  std::string file; ///< Path the manifest came from (for errors).
  /// Tensor name to shard file name, in file order.
  std::vector<std::pair<std::string, std::string>> tensors;
  std::vector<std::string> shards; ///< Unique shard file names, sorted.
  bool hasTotalSize = false;       ///< Whether metadata.total_size was given.
  uint64_t totalSize = 0;          ///< metadata.total_size in bytes.
  /// Every other metadata field, value as compact JSON text, in file order.
  std::vector<std::pair<std::string, std::string>> metadata;
  /// 0 or 1 when shard names follow PREFIX-XXXXX-of-YYYYY.safetensors (the
  /// lowest number a writer uses), else -1.
  int shardNumberBase = -1;
  /// The YYYYY of numbered shard names, 0 when they are not numbered.
  int64_t declaredShardCount = 0;
};

/// Reads the index file at \p path (at most kMaxManifestBytes) and parses it
/// with parseManifest.
Result<Manifest> readManifest(const std::string &path);

/// Parses index JSON \p json in one streaming pass (no DOM), accepting any key
/// order, absent or extended metadata, and any whitespace layout. Rejects
/// invalid JSON (with its byte offset, line and column), a missing or
/// non-object `weight_map`, non-string shard values, empty or repeated tensor
/// names, shard names that are not plain file names (path separators, `..`),
/// and numbered shard names that disagree on prefix or count or fall outside
/// base..count. \p fileForErrors names the file in errors.
Result<Manifest> parseManifest(std::string_view json,
                               const std::string &fileForErrors);

/// The Manifest of a single-file checkpoint (`model.safetensors` with no
/// index): every tensor of \p shard maps to the shard's file name, and
/// total_size is the sum of the tensors' byte sizes, as an index would say.
Result<Manifest> manifestFromShard(const ShardHeader &shard);

} // namespace adapt

#endif // ADAPT_PARSER_MANIFEST_H
