//===- Workspace.cpp - the folders `adapt serve` tools may touch ----------===//

#include "agent/mcp/Workspace.h"

#include <filesystem>
#include <system_error>

namespace adapt::mcp {
namespace fs = std::filesystem;

namespace {

/// Canonicalises each of ROOTS (they must exist and be folders) into INTO.
bool canonicalRoots(const std::vector<std::string> &roots, const char *kind,
                    std::vector<std::string> &into, std::string &error) {
  for (const std::string &root : roots) {
    std::error_code code;
    fs::path canonical = fs::canonical(root, code);
    if (code || !fs::is_directory(canonical, code)) {
      error = std::string(kind) + " root " + root + " is not an existing folder";
      return false;
    }
    into.push_back(canonical.string());
  }
  return true;
}

/// Whether PATH is ROOT or lies below it (both canonical).
bool isInside(const std::string &path, const std::string &root) {
  if (root == "/")
    return true;
  return path == root ||
         (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
          path[root.size()] == '/');
}

std::string joined(const std::vector<std::string> &roots) {
  std::string out;
  for (const std::string &root : roots)
    out += (out.empty() ? "" : ", ") + root;
  return out;
}

} // namespace

std::optional<Workspace> Workspace::create(const std::vector<std::string> &writable,
                                           const std::vector<std::string> &readOnly,
                                           std::string &error) {
  Workspace workspace;
  if (writable.empty()) {
    error = "at least one writable root is needed";
    return std::nullopt;
  }
  if (!canonicalRoots(writable, "--root", workspace.writable, error) ||
      !canonicalRoots(readOnly, "--read-root", workspace.readOnly, error))
    return std::nullopt;
  return workspace;
}

std::optional<std::string> Workspace::resolve(const std::string &path, PathAccess access,
                                              std::string &error) const {
  if (path.empty() || path.find('\0') != std::string::npos) {
    error = "a path must be a non-empty string";
    return std::nullopt;
  }
  fs::path absolute = fs::path(path).is_absolute() ? fs::path(path)
                                                   : fs::path(writable.front()) / path;
  // Follows every symlink of the part that exists and normalises "..", so a
  // link inside a root cannot lead outside it.
  std::error_code code;
  fs::path resolved = fs::weakly_canonical(absolute, code);
  if (code) {
    error = "cannot resolve " + path + ": " + code.message();
    return std::nullopt;
  }
  std::string text = resolved.string();
  while (text.size() > 1 && text.back() == '/')
    text.pop_back();
  for (const std::string &root : writable)
    if (isInside(text, root))
      return text;
  if (access == PathAccess::Read)
    for (const std::string &root : readOnly)
      if (isInside(text, root))
        return text;
  error = path + " is outside the server's " +
          std::string(access == PathAccess::Write ? "writable roots (" : "roots (") +
          joined(writable) +
          (access == PathAccess::Read && !readOnly.empty() ? ", " + joined(readOnly) : "") +
          "); adapt serve --root/--read-root decide where tools may go";
  return std::nullopt;
}

} // namespace adapt::mcp
