//===- TempDir.h - a fresh folder per test --------------------*- C++ -*-===//
#ifndef ADAPT_RUNTIME_TESTS_TEMPDIR_H
#define ADAPT_RUNTIME_TESTS_TEMPDIR_H

#include "runtime/FileSystem.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

namespace adapt::rt::testing {

/// A fresh folder under $TMPDIR (or /tmp), removed with everything in it
/// after the test (made writable first: some tests make it read-only).
class TempDir {
public:
  TempDir() {
    const char *tmp = std::getenv("TMPDIR");
    std::string pattern = joinPath(tmp && *tmp ? tmp : "/tmp", "adapt-test-XXXXXX");
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    ::chmod(path.c_str(), 0700);
    removeAll(path);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  /// A path inside the folder.
  std::string operator/(const std::string &name) const { return joinPath(path, name); }
  /// Writes \p bytes to the file \p name in the folder; returns its path.
  std::string write(const std::string &name, const std::string &bytes) const {
    std::string p = joinPath(path, name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string path;
};

} // namespace adapt::rt::testing

#endif // ADAPT_RUNTIME_TESTS_TEMPDIR_H
