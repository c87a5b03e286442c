//===- TinyModel.h - tiny random-weight models of each family ---*- C++ -*-===//
//
// `adapt tiny FAMILY --out DIR` writes a small, real-looking release of a
// supported family: a config.json with the family's own keys (shrunk to
// hidden 64, 4 heads, 8 experts, ...), model.safetensors.index.json and two
// safetensors shards holding every tensor the config implies under the
// checkpoint's real names. Names, shapes and dtypes come from declareModel
// and expandToDisk, so the front end and the writer never disagree. Values
// are deterministic pseudo-random (splitmix64 + Box-Muller) from the seed:
// the same arguments give byte-identical files. Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_MODELS_TINYMODEL_H
#define ADAPT_MODELS_TINYMODEL_H

#include "parser/InputError.h"

#include <cstdint>
#include <string>
#include <vector>

namespace adapt {

/// What to write.
struct TinyModelOptions {
  std::string family;  ///< One of tinyModelFamilies().
  std::string outDir;  ///< Created when missing; existing files are replaced.
  uint64_t seed = 0;
  int64_t layers = 0;  ///< Decoder layers; 0: the family's default.
  std::string quant;   ///< "", "fp8" (deepseek_v3, kimi_k2), "mxfp4" (gpt_oss).
  /// A released config.json to take the widths from instead of the tiny
  /// ones (num_hidden_layers set to \ref layers when that is given), so that
  /// benchmarks run a real model's shapes with random weights.
  std::string configFile;
  /// Write config.json, the tokenizer, the index and random_weights.json
  /// (every tensor's name, dtype, shape, shard and value distribution)
  /// instead of the shards: a model at real widths is filled on the machine
  /// that trains it (bench/fill_random_weights.py). bf16 checkpoints only.
  bool manifestOnly = false;
};

/// The families `adapt tiny` knows, in a stable order.
const std::vector<std::string> &tinyModelFamilies();

/// The config.json text of the tiny model \p options describes.
Result<std::string> tinyModelConfig(const TinyModelOptions &options);

/// Writes config.json, model.safetensors.index.json and
/// model-0000{1,2}-of-00002.safetensors into options.outDir (or
/// random_weights.json in place of the shards, with manifestOnly). Bad options and
/// I/O failures come back as an InputError.
Result<std::vector<std::string>>
writeTinyModel(const TinyModelOptions &options);

} // namespace adapt

#endif // ADAPT_MODELS_TINYMODEL_H
