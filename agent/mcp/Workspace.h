//===- Workspace.h - the folders `adapt serve` tools may touch ---*- C++ -*-===//
//
// Every path an MCP client passes to a tool is resolved here before a command
// sees it: relative paths are taken from the first writable root, symlinks and
// ".." are resolved, and the result must lie inside a root given at start.
// Outputs (`out`, the generate folder) must lie in a writable root; inputs
// (models, registries, fixtures) may also come from read-only roots.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_WORKSPACE_H
#define ADAPT_AGENT_MCP_WORKSPACE_H

#include <optional>
#include <string>
#include <vector>

namespace adapt::mcp {

/// Whether a tool reads a path or writes under it.
enum class PathAccess { Read, Write };

/// The folders tools are confined to, canonicalised once at start.
class Workspace {
public:
  /// Canonicalises WRITABLE (at least one) and READ_ONLY roots; on failure
  /// returns nullopt and sets ERROR naming the root and the reason.
  static std::optional<Workspace> create(const std::vector<std::string> &writable,
                                         const std::vector<std::string> &readOnly,
                                         std::string &error);

  /// PATH resolved (absolute, symlinks of its existing part followed) when it
  /// lies inside a root that allows ACCESS; else nullopt and ERROR says which
  /// roots it must lie in. The error quotes only the client's own PATH.
  std::optional<std::string> resolve(const std::string &path, PathAccess access,
                                     std::string &error) const;

  /// The roots, for the server's instructions and errors.
  const std::vector<std::string> &writableRoots() const { return writable; }
  const std::vector<std::string> &readOnlyRoots() const { return readOnly; }

private:
  std::vector<std::string> writable, readOnly;
};

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_WORKSPACE_H
