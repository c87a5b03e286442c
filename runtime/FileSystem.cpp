//===- FileSystem.cpp - POSIX file operations and atomic writes -----------===//
#include "runtime/FileSystem.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace adapt::rt {

bool pathExists(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool isDirectory(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool isRegularFile(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string joinPath(const std::string &dir, const std::string &name) {
  if (dir.empty())
    return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string parentPath(const std::string &path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/')
    p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return p.substr(0, slash);
}

std::string absolutePath(const std::string &path) {
  if (!path.empty() && path[0] == '/')
    return path;
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof(cwd)))
    return path;
  std::string rel = path;
  while (rel.rfind("./", 0) == 0)
    rel.erase(0, 2);
  return rel.empty() || rel == "." ? std::string(cwd) : joinPath(cwd, rel);
}

std::string canonicalPath(const std::string &path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

namespace {

/// The entries of \p dir but "." and "..", sorted; false when it cannot be
/// opened (errno says why).
bool readDirectory(const std::string &dir, std::vector<std::string> &names) {
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return false;
  while (dirent *e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..")
      names.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return true;
}

} // namespace

std::vector<std::string> listDirectory(const std::string &dir) {
  std::vector<std::string> names;
  if (!readDirectory(dir, names))
    throw readError(dir, "list folder", errno);
  return names;
}

void createDirectories(const std::string &path) {
  if (path.empty() || isDirectory(path))
    return;
  std::string parent = parentPath(path);
  if (parent != path)
    createDirectories(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && !(errno == EEXIST && isDirectory(path))) {
    if (errno == EEXIST)
      throw RuntimeError(path, "create folder",
                         "expected a folder but something else of that name exists",
                         kExitWriteFailed);
    throw writeError(path, "create folder", errno);
  }
}

bool removeAll(const std::string &path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    return errno == ENOENT;
  if (!S_ISDIR(st.st_mode))
    return ::unlink(path.c_str()) == 0;
  bool ok = true;
  std::vector<std::string> names;
  if (readDirectory(path, names))
    for (const std::string &name : names)
      ok = removeAll(joinPath(path, name)) && ok;
  return ::rmdir(path.c_str()) == 0 && ok;
}

void renamePath(const std::string &from, const std::string &to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw writeError(to, "rename from " + from, errno);
}

void fsyncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw writeError(dir, "open folder for fsync", errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync folders (EINVAL); that is not a failure.
  if (rc != 0 && err != EINVAL && err != EROFS)
    throw writeError(dir, "fsync folder", err);
}

//===----------------------------------------------------------------------===//
// Atomic writes
//===----------------------------------------------------------------------===//

namespace {
std::atomic<int64_t> gFailWritesAfter{-1};
} // namespace

void failWritesAfterForTesting(int64_t bytes) { gFailWritesAfter.store(bytes); }

AtomicFileWriter::AtomicFileWriter(std::string path)
    : finalPath(std::move(path)), tempPath(finalPath + ".tmp") {
  fd = ::open(tempPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw writeError(finalPath, "create " + tempPath, errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd >= 0)
    ::close(fd);
  if (!committed)
    ::unlink(tempPath.c_str());
}

void AtomicFileWriter::fail(const std::string &operation, int err) {
  throw writeError(finalPath, operation + " " + tempPath, err);
}

void AtomicFileWriter::write(const void *data, size_t size) {
  const char *p = static_cast<const char *>(data);
  while (size > 0) {
    size_t chunk = std::min<size_t>(size, size_t(1) << 28);
    int64_t budget = gFailWritesAfter.load();
    if (budget >= 0) {
      if (budget == 0)
        fail("write", ENOSPC);
      chunk = std::min<size_t>(chunk, static_cast<size_t>(budget));
      gFailWritesAfter.store(budget - static_cast<int64_t>(chunk));
    }
    ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      fail("write", errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd) != 0)
    fail("fsync", errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0)
    fail("close", errno);
  if (::rename(tempPath.c_str(), finalPath.c_str()) != 0)
    fail("rename", errno);
  committed = true;
  fsyncDirectory(parentPath(finalPath));
}

void writeFileAtomic(const std::string &path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes.data(), bytes.size());
  writer.commit();
}

void copyFileAtomic(const std::string &from, const std::string &to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0)
    throw readError(from, "open", errno);
  try {
    AtomicFileWriter writer(to);
    std::vector<char> buffer(size_t(1) << 20);
    for (;;) {
      ssize_t n = ::read(in, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        throw readError(from, "read", errno);
      if (n == 0)
        break;
      writer.write(buffer.data(), static_cast<size_t>(n));
    }
    writer.commit();
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

bool writeAll(int fd, const std::string &text) {
  const char *p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

std::shared_ptr<const MappedFile> MappedFile::map(int fd, size_t length) {
  void *addr = ::mmap(nullptr, length, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED)
    return nullptr;
  return std::shared_ptr<const MappedFile>(new MappedFile(addr, length));
}

MappedFile::~MappedFile() { ::munmap(addr, length); }

} // namespace adapt::rt
