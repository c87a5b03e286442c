//===- SafetensorsIO.cpp - read and write safetensors checkpoints ---------===//
//
// Shards are mapped whole with mmap (read-only) and validated before any
// tensor is handed out; size arithmetic is overflow-checked because the
// header is untrusted. Dequantization runs in fp32 and rounds once to the
// target dtype, as the reference implementations do. Writers go through one
// small file writer that loops over partial writes, fsyncs, and removes its
// temp file on any failure.
//
//===----------------------------------------------------------------------===//
#include "runtime/SafetensorsIO.h"
#include "runtime/Json.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace adapt::rt {

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

namespace {

struct DtypeEntry {
  std::string_view name;
  int64_t bits;
  std::optional<torch::ScalarType> type;
};

const DtypeEntry kDtypes[] = {
    {"BOOL", 8, torch::kBool},       {"U8", 8, torch::kByte},
    {"I8", 8, torch::kChar},         {"I16", 16, torch::kShort},
    {"U16", 16, torch::kUInt16},     {"I32", 32, torch::kInt},
    {"U32", 32, torch::kUInt32},     {"I64", 64, torch::kLong},
    {"U64", 64, torch::kUInt64},     {"F16", 16, torch::kHalf},
    {"BF16", 16, torch::kBFloat16},  {"F32", 32, torch::kFloat},
    {"F64", 64, torch::kDouble},     {"C64", 64, torch::kComplexFloat},
    {"F8_E4M3", 8, torch::kFloat8_e4m3fn},
    {"F8_E5M2", 8, torch::kFloat8_e5m2},
    {"F8_E4M3FNUZ", 8, torch::kFloat8_e4m3fnuz},
    {"F8_E5M2FNUZ", 8, torch::kFloat8_e5m2fnuz},
    {"F8_E8M0", 8, torch::kFloat8_e8m0fnu},
    {"F4", 4, std::nullopt},         {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},
};

const DtypeEntry *dtypeEntry(std::string_view name) {
  for (const DtypeEntry &e : kDtypes)
    if (e.name == name)
      return &e;
  return nullptr;
}

bool mulOverflows(uint64_t a, uint64_t b, uint64_t &out) {
  return __builtin_mul_overflow(a, b, &out);
}

} // namespace

int64_t safetensorsDtypeBits(std::string_view dtype) {
  const DtypeEntry *e = dtypeEntry(dtype);
  return e ? e->bits : -1;
}

std::optional<torch::ScalarType> scalarTypeOf(std::string_view dtype) {
  const DtypeEntry *e = dtypeEntry(dtype);
  return e ? e->type : std::nullopt;
}

std::string safetensorsDtypeName(torch::ScalarType type) {
  for (const DtypeEntry &e : kDtypes)
    if (e.type && *e.type == type)
      return std::string(e.name);
  throw RuntimeError("", "dtype",
                     std::string("expected a dtype safetensors can store but "
                                 "got ") + c10::toString(type),
                     kExitInternal);
}

//===----------------------------------------------------------------------===//
// SafetensorsFile
//===----------------------------------------------------------------------===//

SafetensorsFile::SafetensorsFile(const std::string &path) : filePath(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw LoadError(path, "open",
                    std::string("expected a readable safetensors shard but: ") +
                        std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    throw LoadError(path, "open",
                    std::string("expected a regular file") +
                        (err ? std::string(": ") + std::strerror(err) : ""));
  }
  uint64_t fileSize = static_cast<uint64_t>(st.st_size);
  if (fileSize < 8) {
    ::close(fd);
    throw LoadError(path, "header length",
                    "expected at least 8 bytes (the little-endian header "
                    "length) but the file has " + std::to_string(fileSize) +
                        " (truncated?)");
  }
  mapping = MappedFile::map(fd, fileSize);
  int mapErr = errno;
  ::close(fd);
  if (!mapping)
    throw LoadError(path, "mmap",
                    std::string("expected to map the file but: ") +
                        std::strerror(mapErr));

  const uint8_t *bytes = mapping->bytes();
  uint64_t headerBytes = 0;
  for (int i = 7; i >= 0; --i)
    headerBytes = (headerBytes << 8) | bytes[i];
  if (headerBytes > kMaxSafetensorsHeaderBytes)
    throw LoadError(path, "header length",
                    "expected at most " + std::to_string(kMaxSafetensorsHeaderBytes) +
                        " bytes but the first 8 bytes say " +
                        std::to_string(headerBytes));
  if (headerBytes > fileSize - 8)
    throw LoadError(path, "header length",
                    "expected a header of at most " + std::to_string(fileSize - 8) +
                        " bytes (file size minus 8) but the first 8 bytes say " +
                        std::to_string(headerBytes) + " (truncated?)");
  dataStart = 8 + headerBytes;
  uint64_t dataSize = fileSize - dataStart;

  std::string_view headerText(reinterpret_cast<const char *>(bytes + 8),
                              headerBytes);
  JsonValue header = parseJson(headerText, path);
  if (!header.isObject())
    throw LoadError(path, "header",
                    std::string("expected a JSON object but found ") +
                        header.kindName());
  for (const auto &[key, value] : header.asObject()) {
    if (key == "__metadata__") {
      if (!value.isObject())
        throw LoadError(path, "__metadata__",
                        std::string("expected an object of strings but found ") +
                            value.kindName());
      for (const auto &[mk, mv] : value.asObject()) {
        if (!mv.isString())
          throw LoadError(path, "__metadata__." + mk,
                          std::string("expected a string but found ") +
                              mv.kindName());
        meta.emplace_back(mk, mv.asString());
      }
      continue;
    }
    if (!value.isObject())
      throw LoadError(path, key,
                      std::string("expected a tensor entry object but found ") +
                          value.kindName());
    TensorInfo info;
    info.name = key;
    info.file = path;
    const JsonValue *dtype = value.find("dtype");
    if (!dtype || !dtype->isString())
      throw LoadError(path, key + ".dtype", "expected a dtype string");
    info.dtype = dtype->asString();
    int64_t bits = safetensorsDtypeBits(info.dtype);
    if (bits < 0)
      throw LoadError(path, key + ".dtype",
                      "expected a safetensors dtype (BF16, F16, F32, F8_E4M3, "
                      "U8, ...) but found " + jsonQuote(info.dtype));
    const JsonValue *shape = value.find("shape");
    if (!shape || !shape->isArray())
      throw LoadError(path, key + ".shape", "expected an array of dimensions");
    uint64_t numel = 1;
    for (const JsonValue &d : shape->asArray()) {
      if (!d.isInt() || d.asInt() < 0)
        throw LoadError(path, key + ".shape",
                        "expected non-negative integer dimensions but found " +
                            d.dump());
      info.shape.push_back(d.asInt());
      if (mulOverflows(numel, static_cast<uint64_t>(d.asInt()), numel))
        throw LoadError(path, key + ".shape",
                        "expected a shape whose element count fits 64 bits");
    }
    const JsonValue *offsets = value.find("data_offsets");
    if (!offsets || !offsets->isArray() || offsets->asArray().size() != 2 ||
        !offsets->asArray()[0].isInt() || !offsets->asArray()[1].isInt() ||
        offsets->asArray()[0].asInt() < 0 || offsets->asArray()[1].asInt() < 0)
      throw LoadError(path, key + ".data_offsets",
                      "expected [begin, end] with non-negative integers");
    info.begin = static_cast<uint64_t>(offsets->asArray()[0].asInt());
    info.end = static_cast<uint64_t>(offsets->asArray()[1].asInt());
    if (info.begin > info.end)
      throw LoadError(path, key + ".data_offsets",
                      "expected begin <= end but found [" +
                          std::to_string(info.begin) + ", " +
                          std::to_string(info.end) + "]");
    uint64_t totalBits = 0;
    if (mulOverflows(numel, static_cast<uint64_t>(bits), totalBits) ||
        totalBits % 8 != 0)
      throw LoadError(path, key + ".shape",
                      "expected a whole number of bytes for " + info.dtype +
                          " " + formatShape(info.shape));
    if (info.end - info.begin != totalBits / 8)
      throw LoadError(path, key + ".data_offsets",
                      "expected " + std::to_string(totalBits / 8) +
                          " bytes (" + info.dtype + " " + formatShape(info.shape) +
                          ") but the offsets span " +
                          std::to_string(info.end - info.begin));
    if (info.end > dataSize)
      throw LoadError(path, key,
                      "expected bytes [" + std::to_string(info.begin) + ", " +
                          std::to_string(info.end) +
                          ") of the data section, but the file has only " +
                          std::to_string(dataSize) +
                          " data bytes: the file is truncated");
    byName.emplace(info.name, entries.size());
    entries.push_back(std::move(info));
  }
  // No two tensors may share bytes.
  std::vector<const TensorInfo *> sorted;
  for (const TensorInfo &t : entries)
    if (t.end > t.begin)
      sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorInfo *a, const TensorInfo *b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->begin < sorted[i - 1]->end)
      throw LoadError(path, sorted[i]->name + ".data_offsets",
                      "expected no overlap with " + sorted[i - 1]->name +
                          " but their byte ranges overlap");
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile &&) noexcept = default;
SafetensorsFile &SafetensorsFile::operator=(SafetensorsFile &&) noexcept = default;

const TensorInfo *SafetensorsFile::find(const std::string &name) const {
  auto it = byName.find(name);
  return it == byName.end() ? nullptr : &entries[it->second];
}

torch::Tensor SafetensorsFile::view(const std::string &name) const {
  const TensorInfo *info = find(name);
  if (!info)
    throw LoadError(filePath, name, "expected this tensor in the shard's header");
  std::optional<torch::ScalarType> type = scalarTypeOf(info->dtype);
  if (!type)
    throw LoadError(filePath, name,
                    "expected a dtype LibTorch can hold but found " + info->dtype);
  auto options = torch::TensorOptions().dtype(*type).device(torch::kCPU);
  if (info->end == info->begin)
    return torch::empty(info->shape, options);
  const uint8_t *data = mapping->bytes() + dataStart + info->begin;
  size_t elementSize = c10::elementSize(*type);
  if (reinterpret_cast<uintptr_t>(data) % elementSize != 0) {
    torch::Tensor copy = torch::empty(info->shape, options);
    std::memcpy(copy.data_ptr(), data, info->end - info->begin);
    return copy;
  }
  std::shared_ptr<const MappedFile> keepAlive = mapping;
  return torch::from_blob(const_cast<uint8_t *>(data), info->shape,
                          [keepAlive](void *) {}, options);
}

//===----------------------------------------------------------------------===//
// Dequantization
//===----------------------------------------------------------------------===//

torch::Tensor dequantizeFp8Blocks(const torch::Tensor &weight,
                                  const torch::Tensor &scaleInv,
                                  std::array<int64_t, 2> block,
                                  torch::ScalarType dtype,
                                  const std::string &file,
                                  const std::string &name) {
  const std::string scaleName = name + "_scale_inv";
  if (weight.dim() < 2)
    throw LoadError(file, name,
                    "expected an FP8 block-scaled weight of at least 2 dims but "
                    "found " + formatShape(weight.sizes()));
  if (block[0] <= 0 || block[1] <= 0)
    throw LoadError(file, name, "expected a positive FP8 block size");
  int64_t rows = weight.size(-2), cols = weight.size(-1);
  std::vector<int64_t> want(weight.sizes().begin(), weight.sizes().end());
  want[want.size() - 2] = (rows + block[0] - 1) / block[0];
  want[want.size() - 1] = (cols + block[1] - 1) / block[1];
  if (scaleInv.sizes() != c10::IntArrayRef(want))
    throw LoadError(file, scaleName,
                    "expected shape " + formatShape(want) + " (ceil of " +
                        formatShape(weight.sizes()) + " / [" +
                        std::to_string(block[0]) + ", " + std::to_string(block[1]) +
                        "] blocks) but found " + formatShape(scaleInv.sizes()));
  if (!c10::isFloatingType(scaleInv.scalar_type()))
    throw LoadError(file, scaleName,
                    std::string("expected a floating-point scale but found ") +
                        c10::toString(scaleInv.scalar_type()));
  torch::Tensor out = torch::empty(weight.sizes(), torch::TensorOptions().dtype(dtype));
  torch::Tensor scale = scaleInv.to(torch::kFloat);
  // One block row at a time keeps the fp32 temporaries small.
  for (int64_t b = 0; b * block[0] < rows; ++b) {
    int64_t r0 = b * block[0];
    int64_t h = std::min(block[0], rows - r0);
    torch::Tensor s = scale.narrow(-2, b, 1)
                          .repeat_interleave(block[1], -1)
                          .narrow(-1, 0, cols); // [..., 1, cols]
    torch::Tensor w = weight.narrow(-2, r0, h).to(torch::kFloat);
    out.narrow(-2, r0, h).copy_(w * s);
  }
  return out;
}

namespace {

/// The FP4 E2M1 code table of the OCP MX spec, as transformers' FP4_VALUES.
constexpr float kFp4Values[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                  4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                  -2.0f, -3.0f, -4.0f, -6.0f};

/// Decodes MXFP4 into \p out [P, C, R] with C = G * 2B values per row, i.e.
/// the rows [P, R, C] transposed. Rows are decoded a tile at a time into a
/// small fp32 buffer and written out column by column.
template <typename T>
void decodeMxfp4(const uint8_t *blocks, const uint8_t *scales, T *out,
                 int64_t P, int64_t R, int64_t G, int64_t B) {
  constexpr int64_t kTile = 64;
  const int64_t C = G * 2 * B;
  float pow2[256];
  for (int i = 0; i < 256; ++i)
    pow2[i] = std::ldexp(1.0f, i - 127);
  const int64_t tilesPerP = (R + kTile - 1) / kTile;
  at::parallel_for(0, P * tilesPerP, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(static_cast<size_t>(kTile * C));
    for (int64_t t = begin; t < end; ++t) {
      int64_t p = t / tilesPerP;
      int64_t r0 = (t % tilesPerP) * kTile;
      int64_t h = std::min(kTile, R - r0);
      for (int64_t i = 0; i < h; ++i) {
        int64_t row = p * R + r0 + i;
        const uint8_t *rowBlocks = blocks + row * G * B;
        const uint8_t *rowScales = scales + row * G;
        float *dst = tile.data() + i * C;
        for (int64_t g = 0; g < G; ++g) {
          float scale = pow2[rowScales[g]];
          for (int64_t j = 0; j < B; ++j) {
            uint8_t byte = rowBlocks[g * B + j];
            dst[(g * B + j) * 2] = kFp4Values[byte & 0x0f] * scale;
            dst[(g * B + j) * 2 + 1] = kFp4Values[byte >> 4] * scale;
          }
        }
      }
      T *base = out + p * C * R;
      for (int64_t c = 0; c < C; ++c) {
        T *col = base + c * R + r0;
        for (int64_t i = 0; i < h; ++i)
          col[i] = static_cast<T>(tile[static_cast<size_t>(i * C + c)]);
      }
    }
  });
}

} // namespace

torch::Tensor dequantizeMxfp4(const torch::Tensor &blocksIn,
                              const torch::Tensor &scalesIn,
                              torch::ScalarType dtype, const std::string &file,
                              const std::string &name) {
  const std::string blocksName = name + "_blocks", scalesName = name + "_scales";
  if (blocksIn.scalar_type() != torch::kByte)
    throw LoadError(file, blocksName,
                    std::string("expected U8 MXFP4 blocks but found ") +
                        c10::toString(blocksIn.scalar_type()));
  if (scalesIn.scalar_type() != torch::kByte)
    throw LoadError(file, scalesName,
                    std::string("expected U8 MXFP4 scales but found ") +
                        c10::toString(scalesIn.scalar_type()));
  if (blocksIn.dim() < 3)
    throw LoadError(file, blocksName,
                    "expected [..., rows, groups, bytes] (at least 3 dims) but "
                    "found " + formatShape(blocksIn.sizes()));
  auto prefix = blocksIn.sizes().slice(0, blocksIn.dim() - 1);
  if (scalesIn.sizes() != prefix)
    throw LoadError(file, scalesName,
                    "expected shape " + formatShape(prefix) +
                        " (the blocks' shape without the last dim) but found " +
                        formatShape(scalesIn.sizes()));
  torch::Tensor blocks = blocksIn.contiguous(), scales = scalesIn.contiguous();
  const int64_t B = blocks.size(-1), G = blocks.size(-2), R = blocks.size(-3);
  int64_t P = 1;
  std::vector<int64_t> outShape;
  for (int64_t d = 0; d + 3 < blocks.dim(); ++d) {
    P *= blocks.size(d);
    outShape.push_back(blocks.size(d));
  }
  outShape.push_back(G * 2 * B);
  outShape.push_back(R);
  auto decodeAs = [&](torch::ScalarType type) {
    torch::Tensor out = torch::empty(outShape, torch::TensorOptions().dtype(type));
    const uint8_t *bp = blocks.data_ptr<uint8_t>();
    const uint8_t *sp = scales.data_ptr<uint8_t>();
    switch (type) {
    case torch::kFloat: decodeMxfp4(bp, sp, out.data_ptr<float>(), P, R, G, B); break;
    case torch::kDouble: decodeMxfp4(bp, sp, out.data_ptr<double>(), P, R, G, B); break;
    case torch::kBFloat16:
      decodeMxfp4(bp, sp, out.data_ptr<c10::BFloat16>(), P, R, G, B);
      break;
    case torch::kHalf: decodeMxfp4(bp, sp, out.data_ptr<c10::Half>(), P, R, G, B); break;
    default: break;
    }
    return out;
  };
  if (dtype == torch::kFloat || dtype == torch::kDouble ||
      dtype == torch::kBFloat16 || dtype == torch::kHalf)
    return decodeAs(dtype);
  return decodeAs(torch::kFloat).to(dtype);
}

//===----------------------------------------------------------------------===//
// CheckpointReader
//===----------------------------------------------------------------------===//

CheckpointReader::CheckpointReader(const std::string &dir) : modelDir(dir) {
  if (!isDirectory(dir))
    throw LoadError(dir, "model folder", "expected a folder with the checkpoint");
  std::string index = joinPath(dir, "model.safetensors.index.json");
  std::string single = joinPath(dir, "model.safetensors");
  if (pathExists(index)) {
    indexFile = index;
    JsonValue json = readJsonFile(indexFile);
    const JsonValue *map = json.find("weight_map");
    if (!map || !map->isObject())
      throw LoadError(indexFile, "weight_map",
                      "expected an object mapping tensor names to shard files");
    std::unordered_map<std::string, size_t> shardIndex;
    for (const auto &[tensor, file] : map->asObject()) {
      if (!file.isString())
        throw LoadError(indexFile, "weight_map." + tensor,
                        std::string("expected a shard file name but found ") +
                            file.kindName());
      auto it = shardIndex.find(file.asString());
      if (it == shardIndex.end()) {
        std::string shardPath = joinPath(dir, file.asString());
        if (!isRegularFile(shardPath))
          throw LoadError(indexFile, "weight_map." + tensor,
                          "expected the shard " + shardPath +
                              " to exist but it is missing");
        it = shardIndex.emplace(file.asString(), shardFiles.size()).first;
        shardFiles.push_back(shardPath);
      }
      shardOf[tensor] = it->second;
    }
  } else if (pathExists(single)) {
    indexFile = single;
    shardFiles.push_back(indexFile);
    const SafetensorsFile &file = shard(indexFile);
    for (const TensorInfo &t : file.tensors())
      shardOf[t.name] = 0;
  } else {
    throw LoadError(dir, "weights",
                    "expected model.safetensors.index.json or model.safetensors "
                    "in the model folder");
  }
  std::string config = joinPath(dir, "config.json");
  if (pathExists(config)) {
    JsonValue json = readJsonFile(config);
    const JsonValue *quant = json.find("quantization_config");
    const JsonValue *blockSize = quant ? quant->find("weight_block_size") : nullptr;
    if (blockSize) {
      if (!blockSize->isArray() || blockSize->asArray().size() != 2 ||
          !blockSize->asArray()[0].isInt() || !blockSize->asArray()[1].isInt() ||
          blockSize->asArray()[0].asInt() <= 0 || blockSize->asArray()[1].asInt() <= 0)
        throw LoadError(config, "quantization_config.weight_block_size",
                        "expected [rows, cols] with positive integers but found " +
                            blockSize->dump());
      fp8Block = {blockSize->asArray()[0].asInt(), blockSize->asArray()[1].asInt()};
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

const SafetensorsFile &CheckpointReader::shard(const std::string &file) const {
  auto it = open.find(file);
  if (it == open.end())
    it = open.emplace(file, std::make_unique<SafetensorsFile>(file)).first;
  return *it->second;
}

const TensorInfo *CheckpointReader::stored(const std::string &name) const {
  auto it = shardOf.find(name);
  if (it == shardOf.end())
    return nullptr;
  const SafetensorsFile &file = shard(shardFiles[it->second]);
  const TensorInfo *info = file.find(name);
  if (!info)
    throw LoadError(file.path(), name,
                    "expected the tensor that " + indexFile +
                        " assigns to this shard, but its header lacks it");
  return info;
}

bool CheckpointReader::has(const std::string &name) const {
  if (shardOf.count(name))
    return true;
  return shardOf.count(name + "_blocks") && shardOf.count(name + "_scales");
}

TensorEncoding CheckpointReader::encoding(const std::string &name) const {
  if (const TensorInfo *info = stored(name)) {
    if (info->dtype == "F8_E4M3" && shardOf.count(name + "_scale_inv"))
      return TensorEncoding::Fp8Block;
    return TensorEncoding::Plain;
  }
  if (shardOf.count(name + "_blocks") && shardOf.count(name + "_scales"))
    return TensorEncoding::Mxfp4;
  throw LoadError(indexFile, name,
                  "expected this tensor in the checkpoint but it is absent");
}

TensorInfo CheckpointReader::info(const std::string &name) const {
  if (encoding(name) != TensorEncoding::Mxfp4)
    return *stored(name);
  const TensorInfo *blocks = stored(name + "_blocks");
  TensorInfo out;
  out.name = name;
  out.dtype = "MXFP4";
  out.file = blocks->file;
  const auto &s = blocks->shape;
  if (s.size() < 3)
    throw LoadError(blocks->file, blocks->name,
                    "expected [..., rows, groups, bytes] (at least 3 dims) but "
                    "found " + formatShape(s));
  out.shape.assign(s.begin(), s.end() - 3);
  out.shape.push_back(s[s.size() - 2] * 2 * s.back());
  out.shape.push_back(s[s.size() - 3]);
  return out;
}

std::vector<std::string> CheckpointReader::namesInShardOrder() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < shardFiles.size(); ++i) {
    const SafetensorsFile &file = shard(shardFiles[i]);
    std::vector<const TensorInfo *> mine;
    for (const TensorInfo &t : file.tensors()) {
      auto it = shardOf.find(t.name);
      if (it != shardOf.end() && it->second == i)
        mine.push_back(&t);
    }
    std::stable_sort(mine.begin(), mine.end(),
                     [](const TensorInfo *a, const TensorInfo *b) { return a->begin < b->begin; });
    for (const TensorInfo *t : mine)
      names.push_back(t->name);
  }
  // Index entries whose shard header lacks them surface as errors on load;
  // list them too so that nothing the index names is silently skipped.
  if (names.size() != shardOf.size()) {
    std::unordered_set<std::string> seen(names.begin(), names.end());
    for (const auto &[tensor, idx] : shardOf)
      if (!seen.count(tensor))
        names.push_back(tensor);
  }
  return names;
}

torch::Tensor CheckpointReader::view(const std::string &name) const {
  const TensorInfo *info = stored(name);
  if (!info)
    throw LoadError(indexFile, name,
                    "expected this tensor in the checkpoint but it is absent");
  return shard(info->file).view(name);
}

torch::Tensor CheckpointReader::load(const std::string &name,
                                     torch::ScalarType dtype) const {
  switch (encoding(name)) {
  case TensorEncoding::Plain:
    return view(name).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  case TensorEncoding::Fp8Block:
    return dequantizeFp8Blocks(view(name), view(name + "_scale_inv"), fp8Block,
                               dtype, stored(name)->file, name);
  case TensorEncoding::Mxfp4:
    return dequantizeMxfp4(view(name + "_blocks"), view(name + "_scales"), dtype,
                           stored(name + "_blocks")->file, name);
  }
  return {};
}

torch::Tensor CheckpointReader::loadRows(const std::string &name, torch::ScalarType dtype,
                                         int64_t first, int64_t count) const {
  auto rows = [&](const torch::Tensor &t) {
    if (t.dim() == 0 || first < 0 || count < 0 || first + count > t.size(0))
      throw LoadError(stored(name + (encoding(name) == TensorEncoding::Mxfp4 ? "_blocks" : ""))->file, name,
                      "expected at least " + std::to_string(first + count) + " rows in the leading dimension");
    return t.narrow(0, first, count);
  };
  switch (encoding(name)) {
  case TensorEncoding::Plain:
    return rows(view(name)).to(dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
  case TensorEncoding::Fp8Block:
    return dequantizeFp8Blocks(rows(view(name)), rows(view(name + "_scale_inv")), fp8Block, dtype,
                               stored(name)->file, name);
  case TensorEncoding::Mxfp4:
    return dequantizeMxfp4(rows(view(name + "_blocks")), rows(view(name + "_scales")), dtype,
                           stored(name + "_blocks")->file, name);
  }
  return {};
}

std::vector<torch::Tensor>
CheckpointReader::loadAll(const std::vector<std::string> &names,
                          torch::ScalarType dtype,
                          const std::function<void(int64_t, int64_t)> &progress) const {
  std::vector<torch::Tensor> out;
  out.reserve(names.size());
  int64_t total = static_cast<int64_t>(names.size());
  for (const std::string &name : names) {
    out.push_back(load(name, dtype));
    if (progress)
      progress(static_cast<int64_t>(out.size()), total);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

void writeSafetensors(const std::string &path,
                      const std::vector<std::pair<std::string, torch::Tensor>> &tensors,
                      const std::vector<std::pair<std::string, std::string>> &metadata) {
  std::vector<torch::Tensor> data;
  data.reserve(tensors.size());
  JsonValue header = JsonValue::object();
  if (!metadata.empty()) {
    JsonValue meta = JsonValue::object();
    for (const auto &[k, v] : metadata)
      meta.set(k, v);
    header.set("__metadata__", std::move(meta));
  }
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
  for (const auto &[name, tensor] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second)
      throw RuntimeError(path, name,
                         "expected unique tensor names (and not __metadata__)",
                         kExitInternal);
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    JsonValue shape = JsonValue::array();
    for (int64_t d : t.sizes())
      shape.push(d);
    uint64_t bytes = t.numel() * t.element_size();
    header.asObject().emplace_back(name, JsonValue::object({
                         {"dtype", safetensorsDtypeName(t.scalar_type())},
                         {"shape", std::move(shape)},
                         {"data_offsets", JsonValue::array({static_cast<int64_t>(offset),
                                                            static_cast<int64_t>(offset + bytes)})},
                     }));
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string headerText = header.dump();
  headerText.append((8 - headerText.size() % 8) % 8, ' ');
  uint8_t length[8];
  uint64_t n = headerText.size();
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<uint8_t>(n >> (8 * i));

  AtomicFileWriter writer(path);
  writer.write(length, sizeof(length));
  writer.write(headerText.data(), headerText.size());
  for (const torch::Tensor &t : data)
    writer.write(t.data_ptr(), t.numel() * t.element_size());
  writer.commit();
}

std::vector<std::string>
writeShardedCheckpoint(const std::string &dir,
                       const std::vector<std::pair<std::string, torch::Tensor>> &tensors,
                       uint64_t maxShardBytes) {
  createDirectories(dir);
  // Greedy split in order: a shard closes when the next tensor would
  // overflow it.
  std::vector<std::vector<size_t>> shards;
  uint64_t current = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor &t = tensors[i].second;
    uint64_t bytes = t.numel() * t.element_size();
    if (shards.empty() || (current > 0 && current + bytes > maxShardBytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += bytes;
    total += bytes;
  }
  if (shards.empty())
    shards.emplace_back();
  std::vector<std::string> files;
  JsonValue weightMap = JsonValue::object();
  std::unordered_set<std::string> seen;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1,
                  shards.size());
    std::vector<std::pair<std::string, torch::Tensor>> part;
    for (size_t i : shards[s]) {
      part.push_back(tensors[i]);
      if (!seen.insert(tensors[i].first).second)
        throw RuntimeError(dir, tensors[i].first, "expected unique tensor names",
                           kExitInternal);
      weightMap.asObject().emplace_back(tensors[i].first, std::string(name));
    }
    writeSafetensors(joinPath(dir, name), part, {{"format", "pt"}});
    files.push_back(name);
  }
  JsonValue index = JsonValue::object({
      {"metadata", JsonValue::object({{"total_size", static_cast<int64_t>(total)}})},
      {"weight_map", std::move(weightMap)},
  });
  writeFileAtomic(joinPath(dir, "model.safetensors.index.json"),
                  index.dump(2) + "\n");
  return files;
}

} // namespace adapt::rt
