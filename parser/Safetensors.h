//===- Safetensors.h - read the header of a .safetensors shard --*- C++ -*-===//
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON describing every tensor (dtype, shape, byte range), then the raw tensor
// bytes. `adapt` only ever needs the header: it plans from names, dtypes and
// shapes, so these readers never touch the tensor bytes. Every inconsistency
// a writer can leave in a header is reported as an InputError naming the file
// and the field; nothing here throws, crashes or trusts a length it was given.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_SAFETENSORS_H
#define ADAPT_PARSER_SAFETENSORS_H

#include "parser/InputError.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace adapt {

/// Largest header accepted, in bytes. The reference implementation refuses
/// headers over 100 MB too; a larger length is a corrupt or hostile file, and
/// the cap keeps us from allocating whatever the first 8 bytes claim.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// One tensor entry of a safetensors header, as validated against the file.
struct TensorHeader {
  std::string name;           ///< Key in the header JSON.
  std::string dtype;          ///< Safetensors dtype name, e.g. "BF16", "F4".
  std::vector<int64_t> shape; ///< Dimensions, each >= 0; empty for a scalar.
  uint64_t begin = 0;         ///< First byte, relative to the data section.
  uint64_t end = 0;           ///< One past the last byte, same origin.
};

/// Everything a shard's header says, plus the sizes it was checked against.
struct ShardHeader {
  std::string file;          ///< Path the header was read from (for errors).
  uint64_t headerBytes = 0;  ///< N, the JSON header length.
  uint64_t fileSize = 0;     ///< Whole file size, 8 + N + data bytes.
  std::vector<TensorHeader> tensors; ///< In header (file) order.
  /// `__metadata__` entries in header order (string to string by the spec).
  std::vector<std::pair<std::string, std::string>> metadata;
};

/// Bits one element of \p dtype occupies, or -1 when the name is not a
/// safetensors dtype. Bits rather than bytes because F4 and F6_* pack several
/// elements into a byte; tensor sizes must be computed as numel * bits / 8.
int64_t safetensorsDtypeBits(std::string_view dtype);

/// Reads and validates only the header of the safetensors file at \p path:
/// the 8-byte length is checked against the file size and
/// kMaxSafetensorsHeaderBytes before anything is allocated, then the JSON is
/// handed to parseSafetensorsHeader. Tensor bytes are never read.
Result<ShardHeader> readSafetensorsHeader(const std::string &path);

/// The size of the regular file at \p path, which should hold \p what ("an
/// index file"). A missing file, a folder or device, or an unreadable size is
/// an InputError naming \p path. The checks every reader of a checkpoint file
/// (shard headers, the index) makes before opening it.
Result<uint64_t> regularFileSize(const std::string &path, const std::string &what);

/// Validates the header JSON of a shard whose whole file is \p fileSize bytes:
/// a JSON object whose optional `__metadata__` maps strings to strings and
/// whose other keys each hold a known `dtype`, a non-negative integer `shape`
/// and `data_offsets` [begin, end] that fit in the data section, match
/// numel * dtype bits / 8 exactly, and overlap no other tensor. All size
/// arithmetic is overflow-checked. \p fileForErrors names the file in errors.
Result<ShardHeader> parseSafetensorsHeader(std::string_view headerJson,
                                           uint64_t fileSize,
                                           const std::string &fileForErrors);

/// Parses \p whole as the complete bytes of a safetensors file: the first 8
/// bytes are the header length, checked exactly as readSafetensorsHeader
/// checks it, then parseSafetensorsHeader runs on the header slice with
/// whole.size() as the file size. Shared with the fuzz target so that the
/// length handling gets fuzzed too.
Result<ShardHeader> parseSafetensorsBytes(std::string_view whole,
                                          const std::string &fileForErrors);

} // namespace adapt

#endif // ADAPT_PARSER_SAFETENSORS_H
