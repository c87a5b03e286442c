//===- ModelFolder.cpp - find and read a release's files ------------------===//

#include "parser/ModelFolder.h"
#include "parser/Strings.h"
#include "parser/ConfigReader.h"

#include <map>
#include <optional>
#include <set>
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
/// Something is there (a file of any kind, a dangling link included).
bool pathExistsAtAll(const std::string &path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}
} // namespace

bool isOnnxPath(const std::string &path) { return endsWith(path, ".onnx"); }

/// Every tensor the index assigns to a shard whose header was read must be in
/// that header: an index that disagrees with its shards is refused, not read
/// as if the shards were what the index says.
static std::optional<InputError> crossCheckIndex(const Manifest &manifest, const std::vector<ShardHeader> &headers,
                                          const std::string &dir) {
  std::map<std::string, std::set<std::string>> names; // shard file name -> tensors in its header
  for (const ShardHeader &h : headers) {
    std::set<std::string> &in = names[h.file.substr(dir.size())];
    for (const TensorHeader &t : h.tensors)
      in.insert(t.name);
  }
  for (const auto &[tensor, shard] : manifest.tensors) {
    auto it = names.find(shard);
    if (it != names.end() && !it->second.count(tensor))
      return InputError{manifest.file, "weight_map." + tensor,
                        "expected " + tensor + " in " + shard + "'s header, as the index says, but it is not there"};
  }
  return std::nullopt;
}

Result<ModelFiles> loadModelFiles(const std::string &path) {
  ModelFiles files;
  std::string dir;
  if (isDirectory(path)) {
    dir = path.back() == '/' ? path : path + "/";
    files.configPath = dir + "config.json";
    if (!isFile(files.configPath))
      return InputError{files.configPath, "",
                        pathExistsAtAll(files.configPath)
                            ? "expected a regular file, not a device, FIFO or folder"
                            : "expected the model's config.json in this folder"};
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
  for (const std::string *p : {&indexPath, &singlePath})
    if (pathExistsAtAll(*p) && !isFile(*p))
      return InputError{*p, "", "expected a regular file, not a device, FIFO, folder or dangling link"};
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
    if (std::optional<InputError> err = crossCheckIndex(*files.manifest, files.headers, dir))
      return *err;
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
