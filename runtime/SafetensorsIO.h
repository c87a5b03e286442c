//===- SafetensorsIO.h - read and write safetensors checkpoints -*- C++ -*-===//
//
// Reading: a SafetensorsFile maps one shard and hands out CPU tensors over
// the mapping without copying; a CheckpointReader opens a model folder
// (index + shards, or one model.safetensors), knows every tensor's shard and
// loads tensors converted to the wanted dtype, dequantizing DeepSeek-style
// FP8 block-scaled weights and gpt-oss MXFP4 expert weights on the way.
//
// Writing: writeSafetensors and writeShardedCheckpoint write atomically
// through AtomicFileWriter (FileSystem.h: temp file, fsync, rename, fsync of
// the folder), so a crash or a full disk never leaves a half-written file
// under the final name.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_SAFETENSORSIO_H
#define ADAPT_RUNTIME_SAFETENSORSIO_H

#include "runtime/Errors.h"
#include "runtime/FileSystem.h"

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace adapt::rt {

/// Largest header accepted, in bytes (the reference implementation's limit).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// One tensor of a shard's header, validated against the file.
struct TensorInfo {
  std::string name;
  std::string dtype;          ///< Safetensors name: "BF16", "F8_E4M3", "U8", ...
  std::vector<int64_t> shape; ///< Empty for a scalar.
  uint64_t begin = 0;         ///< First byte, relative to the data section.
  uint64_t end = 0;           ///< One past the last byte, same origin.
  std::string file;           ///< The shard's path.
};

/// Bits per element of safetensors dtype \p dtype, or -1 when unknown.
int64_t safetensorsDtypeBits(std::string_view dtype);
/// The LibTorch type of safetensors dtype \p dtype; nullopt for dtypes
/// without one (F4, F6_*) and unknown names.
std::optional<torch::ScalarType> scalarTypeOf(std::string_view dtype);
/// The safetensors name of \p type ("BF16", ...); throws RuntimeError for a
/// type safetensors cannot store.
std::string safetensorsDtypeName(torch::ScalarType type);

/// One shard, memory-mapped read-only (PROT_READ: a writable private
/// mapping would count against the commit limit, and shards can be larger
/// than RAM). Views are therefore read-only: never modify one in place
/// (that faults); CheckpointReader::load returns owned copies. Views keep
/// the mapping alive, so they may outlive the SafetensorsFile.
class SafetensorsFile {
public:
  /// Maps \p path and validates its header: the 8-byte length against the
  /// file size, the JSON, every dtype and shape, data_offsets inside the
  /// data section with size numel * bits / 8, no overlaps. Throws LoadError
  /// naming the file and tensor (a truncated file says so).
  explicit SafetensorsFile(const std::string &path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile &&) noexcept;
  SafetensorsFile &operator=(SafetensorsFile &&) noexcept;

  const std::string &path() const { return filePath; }
  /// Tensors in header order.
  const std::vector<TensorInfo> &tensors() const { return entries; }
  /// The `__metadata__` entries in header order.
  const std::vector<std::pair<std::string, std::string>> &metadata() const {
    return meta;
  }
  /// The entry named \p name, or nullptr.
  const TensorInfo *find(const std::string &name) const;
  /// A CPU tensor over the mapped bytes of \p name (no copy, unless the
  /// bytes are not aligned to the element size, which the format allows:
  /// then an aligned copy). Throws LoadError when absent or when the dtype
  /// has no LibTorch type.
  torch::Tensor view(const std::string &name) const;

private:
  std::string filePath;
  std::shared_ptr<const MappedFile> mapping;
  uint64_t dataStart = 0; ///< 8 + header length.
  std::vector<TensorInfo> entries;
  std::unordered_map<std::string, size_t> byName;
  std::vector<std::pair<std::string, std::string>> meta;
};

/// How a logical tensor is stored in the checkpoint.
enum class TensorEncoding {
  Plain,     ///< As is (converted to the wanted dtype on load).
  Fp8Block,  ///< F8_E4M3 with a sibling `<name>_scale_inv` (DeepSeek).
  Mxfp4,     ///< `<name>_blocks` + `<name>_scales` (gpt-oss).
};

/// A model folder's weights: `model.safetensors.index.json` (its weight_map
/// names each tensor's shard) or one `model.safetensors`. Shards open lazily,
/// once each. Not thread-safe.
class CheckpointReader {
public:
  /// Reads the index (or finds the single file) in \p modelDir and checks
  /// that every shard it names exists; a missing shard or bad index is a
  /// LoadError naming the file. Reads the FP8 block size from config.json's
  /// quantization_config.weight_block_size when present (else 128 x 128).
  explicit CheckpointReader(const std::string &modelDir);
  ~CheckpointReader();

  const std::string &dir() const { return modelDir; }
  /// True for a stored tensor, and for the logical name of an MXFP4 pair.
  bool has(const std::string &name) const;
  TensorEncoding encoding(const std::string &name) const;
  /// The stored header entry of \p name. For an MXFP4 name: dtype "MXFP4",
  /// the shape load() returns and the blocks' shard. Throws LoadError when
  /// absent.
  TensorInfo info(const std::string &name) const;
  /// Every stored tensor name, by shard (in index order of first use) and
  /// then by position in the shard: the order that reads each file once.
  std::vector<std::string> namesInShardOrder() const;
  /// The stored tensor \p name as is: a read-only view over its shard (no
  /// conversion, no copy).
  torch::Tensor view(const std::string &name) const;

  /// Contiguous CPU tensor \p name converted to \p dtype, in memory of its
  /// own (a copy even when the dtype matches). Dequantizes:
  ///  - Fp8Block: real = fp8 * scale_inv of its (rows x cols) block; scale
  ///    shape [..., ceil(out/rows), ceil(in/cols)]; computed in fp32,
  ///    rounded once to \p dtype (DeepSeek's weight_dequant).
  ///  - Mxfp4: see dequantizeMxfp4. The result is [..., G*32, R] for blocks
  ///    [..., R, G, 16]: transformers' convert_moe_packed_tensors layout.
  /// Throws LoadError naming the shard and tensor on any inconsistency.
  torch::Tensor load(const std::string &name, torch::ScalarType dtype) const;
  /// load() of rows [first, first + count) of \p name's leading dimension
  /// (an expert-parallel rank's experts of a fused [E, ...] tensor): only
  /// those bytes of the memory-mapped shard are read and dequantized (FP8
  /// scales and MXFP4 blocks/scales are sliced alike).
  torch::Tensor loadRows(const std::string &name, torch::ScalarType dtype, int64_t first,
                         int64_t count) const;
  /// load() for each of \p names, calling \p progress(done, total) after each.
  std::vector<torch::Tensor>
  loadAll(const std::vector<std::string> &names, torch::ScalarType dtype,
          const std::function<void(int64_t, int64_t)> &progress = {}) const;

  /// FP8 block size (rows, cols) used by load().
  std::array<int64_t, 2> fp8BlockSize() const { return fp8Block; }
  void setFp8BlockSize(int64_t rows, int64_t cols) { fp8Block = {rows, cols}; }

private:
  const SafetensorsFile &shard(const std::string &file) const;
  const TensorInfo *stored(const std::string &name) const;

  std::string modelDir;
  std::string indexFile; ///< The index path, or the single file's, for errors.
  std::vector<std::string> shardFiles; ///< Full paths, in order of first use.
  std::unordered_map<std::string, size_t> shardOf; ///< Tensor -> shardFiles index.
  std::array<int64_t, 2> fp8Block{128, 128};
  mutable std::unordered_map<std::string, std::unique_ptr<SafetensorsFile>> open;
};

/// gpt-oss MXFP4 dequantization, exactly as transformers'
/// convert_moe_packed_tensors: \p blocks U8 [..., R, G, B] holds two FP4 E2M1
/// codes per byte (low nibble first) from the table
/// [+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6];
/// \p scales U8 [..., R, G] scales each row of 2B values by
/// 2^(scale - 127). Row values are [..., R, G*2B]; transformers then
/// transposes dims 1 and 2, which for its 3-D expert tensors is the last
/// two: the result is [..., G*2B, R] (gpt-oss: [E, in, out], the layout the
/// unquantized checkpoint stores). \p file and \p name are for errors.
torch::Tensor dequantizeMxfp4(const torch::Tensor &blocks,
                              const torch::Tensor &scales,
                              torch::ScalarType dtype, const std::string &file,
                              const std::string &name);

/// DeepSeek FP8 block dequantization: \p weight [..., out, in] (any float
/// type, usually F8_E4M3) times \p scaleInv [..., ceil(out/rows),
/// ceil(in/cols)] broadcast over its blocks (edge blocks partial), in fp32,
/// then \p dtype.
torch::Tensor dequantizeFp8Blocks(const torch::Tensor &weight,
                                  const torch::Tensor &scaleInv,
                                  std::array<int64_t, 2> block,
                                  torch::ScalarType dtype,
                                  const std::string &file,
                                  const std::string &name);

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

/// Writes a safetensors file at \p path atomically (AtomicFileWriter):
/// header padded with spaces to a multiple of 8, tensors in the given order
/// (moved to CPU and made contiguous as needed), dtypes BF16, F16, F32, F64,
/// I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2.
void writeSafetensors(const std::string &path,
                      const std::vector<std::pair<std::string, torch::Tensor>> &tensors,
                      const std::vector<std::pair<std::string, std::string>> &metadata = {});

/// Writes \p tensors into \p dir as `model-0000i-of-0000n.safetensors`
/// shards of at most \p maxShardBytes each (a bigger tensor gets a shard of
/// its own), in order, plus `model.safetensors.index.json` with
/// metadata.total_size and the weight_map; each file atomically. Creates
/// \p dir. Returns the shard file names.
std::vector<std::string>
writeShardedCheckpoint(const std::string &dir,
                       const std::vector<std::pair<std::string, torch::Tensor>> &tensors,
                       uint64_t maxShardBytes);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_SAFETENSORSIO_H
