//===- ModelFolder.h - find and read a release's files ----------*- C++ -*-===//
#ifndef ADAPT_PARSER_MODELFOLDER_H
#define ADAPT_PARSER_MODELFOLDER_H

#include "parser/InputError.h"
#include "parser/Manifest.h"
#include "parser/ModelSpec.h"
#include "parser/Safetensors.h"

#include <optional>
#include <string>
#include <vector>

namespace adapt {

/// Everything `adapt` reads from a model folder (or a lone config.json).
struct ModelFiles {
  std::string configPath;
  ModelSpec spec;
  std::optional<Manifest> manifest; ///< Index or single-shard header.
  std::vector<ShardHeader> headers; ///< Headers of the shards present.
};

/// Reads PATH: a folder with config.json (and optionally the manifest and
/// shards) or a config.json file. Shard headers are read when the shards are
/// there; some present and some missing is an error (a partial download).
Result<ModelFiles> loadModelFiles(const std::string &path);

/// True when PATH names an ONNX model file.
bool isOnnxPath(const std::string &path);

} // namespace adapt

#endif // ADAPT_PARSER_MODELFOLDER_H
