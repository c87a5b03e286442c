//===- FileSystem.h - POSIX file operations and atomic writes --*- C++ -*-===//
//
// The runtime does not use std::filesystem. PyTorch's libtorch_cpu.so
// exports its own copy of libstdc++'s std::filesystem (built with the older
// GCC of the wheel's toolchain); a binary built by a newer compiler binds
// part of std::filesystem to that copy and part to its own inline code, and
// crashes where their layouts differ (seen: g++ 13 with PyTorch 2.11's CUDA
// build, in remove_all). These few POSIX helpers replace it.
//
// Writers: AtomicFileWriter writes `path.tmp`, fsyncs, renames over `path`
// and fsyncs the folder, so a crash or a full disk never leaves a
// half-written file under the final name; any failure removes the temp file,
// leaves an existing `path` intact and throws RuntimeError with exit code 6.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_FILESYSTEM_H
#define ADAPT_RUNTIME_FILESYSTEM_H

#include "runtime/Errors.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace adapt::rt {

/// True when \p path exists (following symlinks).
bool pathExists(const std::string &path);
bool isDirectory(const std::string &path);
bool isRegularFile(const std::string &path);
/// \p dir + "/" + \p name (just \p name when \p dir is empty).
std::string joinPath(const std::string &dir, const std::string &name);
/// Everything before the last '/', "." when there is none, "/" for "/x".
std::string parentPath(const std::string &path);
/// \p path made absolute against the working directory (no symlinks resolved).
std::string absolutePath(const std::string &path);
/// realpath(\p path), or "" when it does not exist.
std::string canonicalPath(const std::string &path);
/// Names in folder \p dir (without "." and ".."), sorted; a RuntimeError
/// (exit code 2) when it cannot be read.
std::vector<std::string> listDirectory(const std::string &dir);

/// mkdir -p; RuntimeError with exit code 6 naming the folder on failure.
void createDirectories(const std::string &path);
/// rm -rf, best effort: false when something could not be removed.
bool removeAll(const std::string &path);
/// rename(2); RuntimeError with exit code 6 naming both paths on failure.
void renamePath(const std::string &from, const std::string &to);
/// fsyncs the folder \p dir so that renames in it are durable; exit code 6
/// on failure (file systems that cannot fsync folders are accepted).
void fsyncDirectory(const std::string &dir);

/// Writes one file atomically (see the file comment). Destroying it without
/// commit() removes the temp file.
class AtomicFileWriter {
public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter &) = delete;
  AtomicFileWriter &operator=(const AtomicFileWriter &) = delete;
  /// Appends \p size bytes, looping over partial writes and EINTR.
  void write(const void *data, size_t size);
  /// fsync, close, rename over the final path, fsync of the folder.
  void commit();

private:
  [[noreturn]] void fail(const std::string &operation, int err);
  std::string finalPath, tempPath;
  int fd = -1;
  bool committed = false;
};

/// A read-only mmap of a whole file (safetensors shards, token files),
/// unmapped when its last owner lets go: tensors that view the bytes keep a
/// shared_ptr to it.
class MappedFile {
public:
  /// Maps \p length (> 0) bytes of the open file \p fd; nullptr with errno
  /// set when mmap fails. \p fd may be closed afterwards.
  static std::shared_ptr<const MappedFile> map(int fd, size_t length);
  ~MappedFile();
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  const uint8_t *bytes() const { return static_cast<const uint8_t *>(addr); }

private:
  MappedFile(void *addr, size_t length) : addr(addr), length(length) {}
  void *addr;
  size_t length;
};

/// Whether \p s ends with \p suffix (file and tensor names; C++17 has no
/// ends_with). The runtime's one copy: it builds without the compiler's parser/.
inline bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Writes all of \p text to \p fd, looping over partial writes and EINTR;
/// false with errno set on failure (append-only logs: metrics, events).
bool writeAll(int fd, const std::string &text);

/// Writes \p bytes to \p path atomically.
void writeFileAtomic(const std::string &path, std::string_view bytes);
/// Copies the file \p from to \p to atomically; exit code 2 when \p from
/// cannot be read, 6 when \p to cannot be written.
void copyFileAtomic(const std::string &from, const std::string &to);

/// Test hook: after \p bytes more bytes, every AtomicFileWriter write fails
/// with ENOSPC, as on a full disk; negative disables.
void failWritesAfterForTesting(int64_t bytes);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_FILESYSTEM_H
