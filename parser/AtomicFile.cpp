//===- AtomicFile.cpp - files replaced whole or not at all ----------------===//

#include "parser/AtomicFile.h"

#include <cerrno>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace adapt {

namespace {

bool writeAll(int fd, const std::string &data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

/// Creates \p path with \p data, flushed to disk; on failure sets \p error.
bool writeSynced(const std::string &path, const std::string &data, std::string &error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  bool ok = writeAll(fd, data) && ::fsync(fd) == 0;
  int savedErrno = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    savedErrno = errno;
  }
  if (!ok)
    error = "cannot write " + path + ": " + std::strerror(savedErrno);
  return ok;
}

bool holds(const std::filesystem::path &path, const std::string &contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream existing;
  existing << in.rdbuf();
  return existing.str() == contents;
}

} // namespace

bool writeFilesAtomically(const std::string &dir, const std::vector<std::pair<std::string, std::string>> &files,
                          std::string &error, bool keepIdentical) {
  std::error_code ec;
  std::filesystem::path root(dir.empty() ? std::string(".") : dir);
  std::filesystem::create_directories(root, ec);
  if (ec || !std::filesystem::is_directory(root, ec)) {
    error = "cannot create directory " + root.string() + ": " + (ec ? ec.message() : std::string("not a directory"));
    return false;
  }
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  std::vector<std::pair<std::string, std::string>> pending; // (temporary, target)
  auto cleanup = [&pending] {
    for (const auto &p : pending)
      ::unlink(p.first.c_str());
  };
  try {
    for (const auto &[name, data] : files) {
      const std::filesystem::path target = root / name;
      if (keepIdentical && holds(target, data))
        continue;
      const std::string temp = (target.parent_path() / ("." + target.filename().string() + suffix)).string();
      pending.emplace_back(temp, target.string());
      if (!writeSynced(temp, data, error)) {
        cleanup();
        return false;
      }
    }
  } catch (const std::exception &e) {
    error = std::string("cannot write into ") + root.string() + ": " + e.what();
    cleanup();
    return false;
  }
  for (const auto &[temp, target] : pending)
    if (::rename(temp.c_str(), target.c_str()) != 0) {
      error = "cannot rename " + temp + " to " + target + ": " + std::strerror(errno);
      cleanup();
      return false;
    }
  int dirFd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
  return true;
}

bool writeFileAtomically(const std::string &path, const std::string &contents, std::string &error,
                         bool keepIdentical) {
  const std::filesystem::path p(path);
  return writeFilesAtomically(p.parent_path().string(), {{p.filename().string(), contents}}, error, keepIdentical);
}

} // namespace adapt
