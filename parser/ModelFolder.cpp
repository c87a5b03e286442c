//===- ModelFolder.cpp - find and read a release's files ------------------===//

#include "parser/ModelFolder.h"
#include "parser/ConfigReader.h"

#include <sys/stat.h>

namespace adapt {
namespace {
bool isDirectory(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool isFile(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
} // namespace

bool isOnnxPath(const std::string &path) { return endsWith(path, ".onnx"); }

Result<ModelFiles> loadModelFiles(const std::string &path) {
  ModelFiles files;
  std::string dir;
  if (isDirectory(path)) {
    dir = path.back() == '/' ? path : path + "/";
    files.configPath = dir + "config.json";
    if (!isFile(files.configPath))
      return InputError{files.configPath, "",
                        "expected the model's config.json in this folder"};
  } else if (isFile(path)) {
    files.configPath = path;
    size_t slash = path.find_last_of('/');
    dir = slash == std::string::npos ? "./" : path.substr(0, slash + 1);
  } else {
    return InputError{path, "", "expected a model folder, a config.json or an "
                                ".onnx file; nothing exists at this path"};
  }
  Result<ModelSpec> spec = readModelConfig(files.configPath);
  if (!spec)
    return spec.error();
  files.spec = std::move(spec.value());

  std::string indexPath = dir + "model.safetensors.index.json";
  std::string singlePath = dir + "model.safetensors";
  if (isFile(indexPath)) {
    Result<Manifest> manifest = readManifest(indexPath);
    if (!manifest)
      return manifest.error();
    files.manifest = std::move(manifest.value());
    std::vector<std::string> missing;
    for (const std::string &shard : files.manifest->shards) {
      std::string shardPath = dir + shard;
      if (!isFile(shardPath)) {
        missing.push_back(shard);
        continue;
      }
      Result<ShardHeader> header = readSafetensorsHeader(shardPath);
      if (!header)
        return header.error();
      files.headers.push_back(std::move(header.value()));
    }
    if (!files.headers.empty() && !missing.empty())
      return InputError{indexPath, "weight_map",
                        "expected every shard it names next to it; missing " +
                            missing.front() + " (" +
                            std::to_string(missing.size()) + " of " +
                            std::to_string(files.manifest->shards.size()) +
                            " shards absent)"};
  } else if (isFile(singlePath)) {
    Result<ShardHeader> header = readSafetensorsHeader(singlePath);
    if (!header)
      return header.error();
    Result<Manifest> manifest = manifestFromShard(header.value());
    if (!manifest)
      return manifest.error();
    files.manifest = std::move(manifest.value());
    files.headers.push_back(std::move(header.value()));
  }
  return files;
}

} // namespace adapt
