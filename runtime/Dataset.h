//===- Dataset.h - tokenized training data, packed into windows -*- C++ -*-===//
//
// Training data is already tokenized (docs/datasets.md): JSONL with one
// document per line, or the binary ADAPTTOK format for large sets, read with
// mmap. PackedDataset concatenates the documents (each followed by an EOS id
// when one is given) into one token stream, cuts it into windows of seqLen
// tokens and serves batches as a pure function of the step number: window
// order is a Fisher-Yates shuffle per epoch driven by std::mt19937_64 seeded
// with seed + epoch, so a resumed run sees exactly the batches an
// uninterrupted run would have seen.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_DATASET_H
#define ADAPT_RUNTIME_DATASET_H

#include "runtime/Errors.h"
#include "runtime/FileSystem.h"

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace adapt::rt {

/// Label value that excludes a position from the loss (PyTorch's default
/// ignore_index).
constexpr int64_t kIgnoreLabel = -100;

/// Magic of the binary pre-tokenized format.
constexpr char kTokenFileMagic[8] = {'A', 'D', 'A', 'P', 'T', 'T', 'O', 'K'};
/// Header bytes of the binary format: magic, uint32 version, uint32 width.
constexpr int64_t kTokenFileHeaderBytes = 16;

/// How to pack the data.
struct DatasetOptions {
  int64_t seqLen = 0;  ///< Tokens per window (>= 2).
  int64_t vocab = 0;   ///< Every id must be in [0, vocab).
  int64_t eos = -1;    ///< Appended after every document when >= 0.
  uint64_t seed = 0;   ///< Window shuffle: epoch e uses seed + e.
  /// false (`train --no-packing`): every document starts a window, a longer
  /// one continues in the next, and the rest of a window is masked padding,
  /// so no token ever attends to another document's (causal attention
  /// never looks at the padding after it). true: documents are concatenated.
  bool packing = true;
};

/// One batch: ids and labels [B, T], int64 on the CPU. labels equal ids
/// except kIgnoreLabel where masked (JSONL labels, a document's first token
/// when no EOS separates it from the previous one, and tail padding). The
/// model shifts: position t predicts labels[t + 1].
struct Batch {
  torch::Tensor ids;
  torch::Tensor labels;
  /// Images of the batch's image documents (JSONL "images"), in sample
  /// order: pixel_values [patches, C*T*P*P] and image_grid_thw [images, 3];
  /// undefined when the batch has none.
  torch::Tensor pixels, gridThw;
};

/// Documents from a JSONL or ADAPTTOK file, packed into shuffled windows.
class PackedDataset {
public:
  /// Reads \p path (ADAPTTOK when it starts with the magic, else JSONL) and
  /// validates every token id against options.vocab. Throws RuntimeError
  /// (exit code 2) naming the file, the line (JSONL) or byte offset
  /// (binary), the field, the id and the vocabulary size.
  PackedDataset(const std::string &path, const DatasetOptions &options);
  ~PackedDataset();

  /// Documents read (empty ones are skipped).
  int64_t documents() const { return static_cast<int64_t>(docs.size()); }
  /// Tokens in the packed stream, EOS ids included.
  int64_t streamTokens() const { return streamLength; }
  /// Windows served per epoch: windows with at least one target
  /// (a label at positions 1..T-1 that is not masked).
  int64_t windows() const { return static_cast<int64_t>(usable.size()); }
  const DatasetOptions &options() const { return opts; }
  const std::string &path() const { return filePath; }

  /// Batch \p step of \p batchSize windows: sample b is the
  /// (step * batchSize + b)-th window of the endless sequence of shuffled
  /// epochs. Deterministic in (file, options, step, batchSize).
  Batch batch(int64_t step, int64_t batchSize) const;
  /// Epoch and usable-window index of sample \p sample (step * batchSize + b).
  std::pair<int64_t, int64_t> windowOfSample(int64_t sample) const;
  /// Window \p w of the unshuffled stream into \p ids / \p labels (seqLen each).
  void window(int64_t w, int64_t *ids, int64_t *labels) const;

  /// A short text identifying the data and packing (SHA-256 of the file's
  /// bytes: whole up to 64 MiB, else 16 evenly spaced 1 MiB blocks; size,
  /// documents, tokens, windows, options), stored in checkpoints so that
  /// --resume warns when the data changed, also at the same size.
  std::string fingerprint() const;

private:
  struct Document {
    uint64_t sourceStart; ///< First token in the source (file or memory).
    uint64_t length;      ///< Tokens, EOS excluded.
    uint64_t streamStart; ///< First position in the packed stream.
    int64_t images = -1;  ///< Index into imageFiles; -1: a text document.
  };
  void readJsonl();
  void readBinary();
  /// Checks an image document's file: pixel_values [N, D], image_grid_thw [n, 3].
  void checkImageFile(const std::string &file, const std::string &where) const;
  void finishPacking();
  int64_t sourceToken(uint64_t i) const;
  const std::vector<int64_t> &permutation(int64_t epoch) const;

  std::string filePath;
  DatasetOptions opts;
  uint64_t fileBytes = 0;
  // JSONL: tokens in memory; labels only when some line gave them.
  std::vector<int32_t> memIds, memLabels;
  // Binary: the mapped file.
  std::shared_ptr<const MappedFile> mapping;
  const uint8_t *tokens = nullptr; ///< First token byte.
  int tokenWidth = 0;              ///< 0: memory (JSONL); 2 or 4: binary.
  std::vector<Document> docs;
  uint64_t streamLength = 0;
  int64_t totalWindows = 0;
  std::vector<int64_t> usable; ///< Windows with a target, ascending.
  /// Image documents: their safetensors files (pixel_values, image_grid_thw),
  /// and per window the image document it holds (-1: none). An image
  /// document starts a window and lies wholly inside it.
  std::vector<std::string> imageFiles;
  std::vector<int64_t> windowImages;
  mutable std::mutex cacheMutex;
  mutable int64_t cachedEpoch = -1;
  mutable std::vector<int64_t> cachedPermutation;
};

/// The shuffle PackedDataset uses: a Fisher-Yates permutation of [0, n)
/// driven by std::mt19937_64(seed), with j = rng() % (i + 1). Spelled out
/// rather than std::shuffle so that every standard library gives the same
/// order.
std::vector<int64_t> shuffledIndices(int64_t n, uint64_t seed);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_DATASET_H
