//===- Dataset.cpp - tokenized training data, packed into windows ---------===//
//
// Both formats are turned into one table of documents over a token source
// (a vector for JSONL, the mapped file for ADAPTTOK), so packing and
// batching do not care where tokens came from. Stream positions map to
// documents by binary search over their start positions; a window is filled
// by walking forward from there.
//
//===----------------------------------------------------------------------===//
#include "runtime/Dataset.h"
#include "runtime/FileSystem.h"
#include "runtime/Json.h"
#include "runtime/SafetensorsIO.h"
#include "runtime/Sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace adapt::rt {

std::vector<int64_t> shuffledIndices(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    uint64_t j = rng() % static_cast<uint64_t>(i + 1);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

PackedDataset::PackedDataset(const std::string &path, const DatasetOptions &options)
    : filePath(path), opts(options) {
  if (opts.seqLen < 2)
    throw badInput("", "--seq-len",
                   "expected at least 2 tokens per sequence but got " +
                       std::to_string(opts.seqLen));
  if (opts.vocab <= 0)
    throw badInput("", "vocab", "expected a positive vocabulary size");
  if (opts.eos >= opts.vocab)
    throw badInput("", "--eos",
                   "expected an id below the vocabulary size " +
                       std::to_string(opts.vocab) + " but got " +
                       std::to_string(opts.eos));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw readError(path, "open", errno);
  if (!S_ISREG(st.st_mode))
    throw badInput(path, "data", "expected a regular file (JSONL or ADAPTTOK)");
  fileBytes = static_cast<uint64_t>(st.st_size);
  bool binary = false;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw readError(path, "open", errno);
    char magic[8] = {};
    in.read(magic, 8);
    binary = in.gcount() == 8 && std::memcmp(magic, kTokenFileMagic, 8) == 0;
  }
  if (binary)
    readBinary();
  else
    readJsonl();
  finishPacking();
}

PackedDataset::~PackedDataset() = default;

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

namespace {

/// Parses one JSONL token list (\p field names it in errors) into \p out,
/// checking each entry is an integer in [0, vocab) (or -100 for labels).
void readIdList(const JsonValue &list, const std::string &where,
                const std::string &field, int64_t vocab, bool isLabels,
                std::vector<int32_t> &out) {
  if (!list.isArray())
    throw badInput(where, field,
                   std::string("expected an array of integer token ids but "
                               "found ") + list.kindName());
  const JsonArray &items = list.asArray();
  for (size_t i = 0; i < items.size(); ++i) {
    const JsonValue &v = items[i];
    std::string at = field + "[" + std::to_string(i) + "]";
    if (!v.isInt())
      throw badInput(where, at,
                     std::string("expected an integer token id but found ") +
                         (v.isNumber() ? v.dump() : v.kindName()));
    int64_t id = v.asInt();
    if (isLabels && id == kIgnoreLabel) {
      out.push_back(static_cast<int32_t>(id));
      continue;
    }
    if (id < 0 || id >= vocab)
      throw badInput(where, at,
                     "expected a token id in [0, " + std::to_string(vocab) +
                         ") (the vocabulary size is " + std::to_string(vocab) +
                         (isLabels ? "; -100 ignores a position" : "") +
                         ") but found " + std::to_string(id));
    out.push_back(static_cast<int32_t>(id));
  }
}

} // namespace

void PackedDataset::readJsonl() {
  std::ifstream in(filePath, std::ios::binary);
  if (!in)
    throw readError(filePath, "open", errno);
  std::string line;
  int64_t lineNo = 0;
  bool anyLabels = false;
  std::vector<int32_t> ids, labels;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    std::string where = filePath + ":" + std::to_string(lineNo);
    JsonValue doc = parseJson(line, where);
    ids.clear();
    labels.clear();
    bool hasLabels = false;
    if (doc.isArray()) {
      readIdList(doc, where, "", opts.vocab, false, ids);
    } else if (doc.isObject()) {
      const JsonValue *inputIds = doc.find("input_ids");
      if (!inputIds)
        throw badInput(where, "input_ids",
                       "expected an \"input_ids\" array of token ids in the "
                       "object");
      readIdList(*inputIds, where, "input_ids", opts.vocab, false, ids);
      if (const JsonValue *lab = doc.find("labels"); lab && !lab->isNull()) {
        readIdList(*lab, where, "labels", opts.vocab, true, labels);
        if (labels.size() != ids.size())
          throw badInput(where, "labels",
                         "expected as many labels as input_ids (" +
                             std::to_string(ids.size()) + ") but found " +
                             std::to_string(labels.size()));
        hasLabels = true;
      }
    } else {
      throw badInput(where, "line",
                     std::string("expected an object with \"input_ids\" or an "
                                 "array of token ids but found ") +
                         doc.kindName());
    }
    if (ids.empty())
      continue;
    int64_t imageIndex = -1;
    if (doc.isObject())
      if (const JsonValue *img = doc.find("images"); img && !img->isNull()) {
        if (!img->isString())
          throw badInput(where, "images",
                         "expected the path of a safetensors file with pixel_values and image_grid_thw");
        std::string file = img->asString();
        if (!file.empty() && file[0] != '/')
          file = joinPath(parentPath(filePath), file);
        checkImageFile(file, where);
        imageIndex = static_cast<int64_t>(imageFiles.size());
        imageFiles.push_back(file);
      }
    if (hasLabels && !anyLabels) {
      // First labelled document: earlier ones are labelled by their ids.
      memLabels = memIds;
      anyLabels = true;
    }
    docs.push_back({memIds.size(), ids.size(), 0, imageIndex});
    memIds.insert(memIds.end(), ids.begin(), ids.end());
    if (anyLabels)
      memLabels.insert(memLabels.end(), hasLabels ? labels.begin() : ids.begin(),
                       hasLabels ? labels.end() : ids.end());
  }
  if (in.bad())
    throw readError(filePath, "read", errno);
}

void PackedDataset::readBinary() {
  if (fileBytes < static_cast<uint64_t>(kTokenFileHeaderBytes))
    throw badInput(filePath, "header",
                   "expected a 16-byte ADAPTTOK header but the file has " +
                       std::to_string(fileBytes) + " bytes");
  int fd = ::open(filePath.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw readError(filePath, "open", errno);
  mapping = MappedFile::map(fd, fileBytes);
  int err = errno;
  ::close(fd);
  if (!mapping)
    throw readError(filePath, "mmap", err);
  const uint8_t *bytes = mapping->bytes();
  auto u32 = [&](size_t at) {
    return uint32_t(bytes[at]) | uint32_t(bytes[at + 1]) << 8 |
           uint32_t(bytes[at + 2]) << 16 | uint32_t(bytes[at + 3]) << 24;
  };
  uint32_t version = u32(8), width = u32(12);
  if (version != 1)
    throw badInput(filePath, "header.version",
                   "expected ADAPTTOK version 1 but found " + std::to_string(version));
  if (width != 2 && width != 4)
    throw badInput(filePath, "header.width",
                   "expected a token width of 2 or 4 bytes but found " +
                       std::to_string(width));
  uint64_t body = fileBytes - kTokenFileHeaderBytes;
  if (body % width != 0)
    throw badInput(filePath, "tokens",
                   "expected a whole number of " + std::to_string(width) +
                       "-byte tokens after the header but " + std::to_string(body) +
                       " bytes is not a multiple (truncated?)");
  tokens = bytes + kTokenFileHeaderBytes;
  tokenWidth = static_cast<int>(width);
  const uint64_t count = body / width;
  const uint32_t marker = width == 2 ? 0xffffu : 0xffffffffu;
  uint64_t docStart = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t id = width == 2 ? uint32_t(tokens[2 * i]) | uint32_t(tokens[2 * i + 1]) << 8
                             : u32(kTokenFileHeaderBytes + 4 * i);
    if (id == marker) {
      if (i > docStart)
        docs.push_back({docStart, i - docStart, 0});
      docStart = i + 1;
      continue;
    }
    if (id >= static_cast<uint64_t>(opts.vocab))
      throw badInput(filePath,
                     "token " + std::to_string(i) + " at byte offset " +
                         std::to_string(kTokenFileHeaderBytes + i * width),
                     "expected a token id in [0, " + std::to_string(opts.vocab) +
                         ") (the vocabulary size is " + std::to_string(opts.vocab) +
                         ") but found " + std::to_string(id));
  }
  if (count > docStart)
    docs.push_back({docStart, count - docStart, 0});
}

int64_t PackedDataset::sourceToken(uint64_t i) const {
  if (tokenWidth == 0)
    return memIds[i];
  if (tokenWidth == 2)
    return int64_t(tokens[2 * i]) | int64_t(tokens[2 * i + 1]) << 8;
  const uint8_t *p = tokens + 4 * i;
  return int64_t(p[0]) | int64_t(p[1]) << 8 | int64_t(p[2]) << 16 |
         int64_t(p[3]) << 24;
}

//===----------------------------------------------------------------------===//
// Packing
//===----------------------------------------------------------------------===//

void PackedDataset::finishPacking() {
  const uint64_t T = static_cast<uint64_t>(opts.seqLen);
  uint64_t pos = 0;
  for (Document &d : docs) {
    const uint64_t span = d.length + (opts.eos >= 0 ? 1 : 0);
    if (d.images >= 0 && span > T) // An image document is never cut.
      throw badInput(imageFiles[static_cast<size_t>(d.images)], "input_ids",
                     "expected a document with images to fit in one window of --seq-len " +
                         std::to_string(T) + " tokens but it has " + std::to_string(span) +
                         " (EOS included)");
    // An image document, and without packing every document, starts a
    // window: the gap before it is masked padding.
    if (d.images >= 0 || !opts.packing)
      pos = (pos + T - 1) / T * T;
    d.streamStart = pos;
    pos += span;
  }
  streamLength = pos;
  if (streamLength == 0)
    throw badInput(filePath, "data", "expected at least one token");
  totalWindows = static_cast<int64_t>((streamLength + T - 1) / T);
  windowImages.assign(imageFiles.empty() ? 0 : static_cast<size_t>(totalWindows), -1);
  for (const Document &d : docs)
    if (d.images >= 0)
      windowImages[static_cast<size_t>(d.streamStart / T)] = d.images;
  // Only windows with something to learn are served: a window whose labels
  // at 1..T-1 are all masked would make the mean loss 0/0. Without labels
  // and with EOS, only the padded tail can be such a window.
  bool mayLackTargets = !memLabels.empty() || opts.eos < 0 || !imageFiles.empty() || !opts.packing;
  std::vector<int64_t> ids(T), labels(T);
  usable.reserve(static_cast<size_t>(totalWindows));
  for (int64_t w = 0; w < totalWindows; ++w) {
    if (!mayLackTargets && w + 1 < totalWindows) {
      usable.push_back(w);
      continue;
    }
    window(w, ids.data(), labels.data());
    bool target = false;
    for (uint64_t t = 1; t < T && !target; ++t)
      target = labels[t] != kIgnoreLabel;
    if (target)
      usable.push_back(w);
  }
  if (usable.empty())
    throw badInput(filePath, "data",
                   "expected at least one window of " + std::to_string(T) +
                       " tokens with a token to predict (all labels are -100 "
                       "or documents are single tokens)");
}

void PackedDataset::window(int64_t w, int64_t *ids, int64_t *labels) const {
  const uint64_t T = static_cast<uint64_t>(opts.seqLen);
  uint64_t pos = static_cast<uint64_t>(w) * T;
  // The document holding pos: the last one starting at or before it.
  auto it = std::upper_bound(docs.begin(), docs.end(), pos,
                             [](uint64_t p, const Document &d) { return p < d.streamStart; });
  size_t di = static_cast<size_t>(it - docs.begin()) - 1;
  const int64_t pad = opts.eos >= 0 ? opts.eos : 0;
  for (uint64_t t = 0; t < T; ++t, ++pos) {
    while (di < docs.size() &&
           pos >= docs[di].streamStart + docs[di].length + (opts.eos >= 0 ? 1 : 0))
      ++di;
    if (di >= docs.size()) { // Tail padding.
      ids[t] = pad;
      labels[t] = kIgnoreLabel;
      continue;
    }
    const Document &d = docs[di];
    if (pos < d.streamStart) { // Padding before a window-aligned document.
      ids[t] = pad;
      labels[t] = kIgnoreLabel;
      continue;
    }
    uint64_t offset = pos - d.streamStart;
    if (offset == d.length) { // The EOS after the document.
      ids[t] = opts.eos;
      labels[t] = opts.eos;
      continue;
    }
    uint64_t src = d.sourceStart + offset;
    ids[t] = sourceToken(src);
    labels[t] = memLabels.empty() ? ids[t] : memLabels[src];
    // Without an EOS, nothing marks where a document starts: predicting its
    // first token from the previous document would teach noise.
    if (opts.eos < 0 && offset == 0 && pos > 0)
      labels[t] = kIgnoreLabel;
  }
}

//===----------------------------------------------------------------------===//
// Batching
//===----------------------------------------------------------------------===//

const std::vector<int64_t> &PackedDataset::permutation(int64_t epoch) const {
  if (cachedEpoch != epoch) {
    cachedPermutation = shuffledIndices(windows(), opts.seed + static_cast<uint64_t>(epoch));
    cachedEpoch = epoch;
  }
  return cachedPermutation;
}

std::pair<int64_t, int64_t> PackedDataset::windowOfSample(int64_t sample) const {
  std::lock_guard<std::mutex> lock(cacheMutex);
  int64_t n = windows();
  int64_t epoch = sample / n;
  return {epoch, usable[static_cast<size_t>(permutation(epoch)[static_cast<size_t>(sample % n)])]};
}

Batch PackedDataset::batch(int64_t step, int64_t batchSize) const {
  if (step < 0 || batchSize <= 0)
    throw badInput("", "batch",
                   "expected step >= 0 and batch size > 0 but got step " +
                       std::to_string(step) + ", batch " + std::to_string(batchSize));
  const int64_t T = opts.seqLen;
  Batch out;
  out.ids = torch::empty({batchSize, T}, torch::kLong);
  out.labels = torch::empty({batchSize, T}, torch::kLong);
  int64_t *ids = out.ids.data_ptr<int64_t>();
  int64_t *labels = out.labels.data_ptr<int64_t>();
  std::vector<torch::Tensor> pixels, grids;
  for (int64_t b = 0; b < batchSize; ++b) {
    int64_t w = windowOfSample(step * batchSize + b).second;
    window(w, ids + b * T, labels + b * T);
    if (!windowImages.empty() && windowImages[static_cast<size_t>(w)] >= 0) {
      SafetensorsFile images(imageFiles[static_cast<size_t>(windowImages[static_cast<size_t>(w)])]);
      pixels.push_back(images.view("pixel_values").to(torch::kFloat32).clone());
      grids.push_back(images.view("image_grid_thw").to(torch::kInt64).clone());
    }
  }
  if (!pixels.empty()) {
    out.pixels = torch::cat(pixels);
    out.gridThw = torch::cat(grids);
  }
  return out;
}

void PackedDataset::checkImageFile(const std::string &file, const std::string &where) const {
  if (!isRegularFile(file))
    throw badInput(where, "images", "expected a safetensors file with pixel_values and image_grid_thw at " + file);
  SafetensorsFile images(file);
  const TensorInfo *pv = images.find("pixel_values");
  const TensorInfo *grid = images.find("image_grid_thw");
  if (!pv || pv->shape.size() != 2)
    throw badInput(file, "pixel_values", "expected a [patches, C*T*P*P] tensor (the image processor's pixel_values)");
  if (!grid || grid->shape.size() != 2 || grid->shape[1] != 3)
    throw badInput(file, "image_grid_thw", "expected an [images, 3] tensor of (t, h, w) patch counts");
}

namespace {
/// Files up to this size are hashed whole for the fingerprint; larger ones
/// by kDigestSamples evenly spaced blocks of kDigestBlock bytes (first and
/// last included), so a multi-GB token file costs milliseconds at start.
constexpr uint64_t kDigestWhole = 64ull << 20, kDigestBlock = 1ull << 20;
constexpr uint64_t kDigestSamples = 16;

/// SHA-256 of \p path's content (whole or sampled, see above), hex.
std::string contentDigest(const std::string &path, uint64_t size) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw readError(path, "open", errno);
  Sha256 h;
  std::vector<char> buffer(kDigestBlock);
  auto hashRange = [&](uint64_t begin, uint64_t length) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(begin));
    while (length > 0) {
      in.read(buffer.data(), static_cast<std::streamsize>(std::min<uint64_t>(length, buffer.size())));
      const std::streamsize got = in.gcount();
      if (got <= 0)
        throw readError(path, "read", errno);
      h.update(buffer.data(), static_cast<size_t>(got));
      length -= static_cast<uint64_t>(got);
    }
  };
  if (size <= kDigestWhole) {
    hashRange(0, size);
  } else {
    for (uint64_t i = 0; i < kDigestSamples; ++i)
      hashRange((size - kDigestBlock) / (kDigestSamples - 1) * i, kDigestBlock);
  }
  return h.hex();
}
} // namespace

std::string PackedDataset::fingerprint() const {
  return std::string(fileBytes <= kDigestWhole ? "sha256=" : "sha256_sampled=") +
         contentDigest(filePath, fileBytes) + " file_bytes=" + std::to_string(fileBytes) +
         " documents=" + std::to_string(docs.size()) +
         " stream_tokens=" + std::to_string(streamLength) +
         " windows=" + std::to_string(usable.size()) +
         " seq_len=" + std::to_string(opts.seqLen) +
         " eos=" + std::to_string(opts.eos) + " seed=" + std::to_string(opts.seed) +
         (opts.packing ? std::string() : " packing=off") +
         (imageFiles.empty() ? std::string() : " image_documents=" + std::to_string(imageFiles.size()));
}

} // namespace adapt::rt
