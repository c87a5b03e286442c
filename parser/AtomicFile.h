//===- AtomicFile.h - files replaced whole or not at all -------*- C++ -*-===//
//
// The compiler side's one atomic writer (gap reports, generated trainer
// projects, plans). The runtime keeps its own (runtime/FileSystem.h): it
// builds on the GPU machines with LibTorch alone, without this folder.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_ATOMICFILE_H
#define ADAPT_PARSER_ATOMICFILE_H

#include <string>
#include <utility>
#include <vector>

namespace adapt {

/// Writes each (name, contents) of \p files into \p dir (created with its
/// parents): every file goes to a temporary name in \p dir, is fsynced, and
/// only when all are written are they renamed over their targets, so an
/// interrupted run leaves the old files or the new ones, never half of one.
/// With \p keepIdentical, a target that already holds the same bytes is left
/// alone (its timestamp too, so a rebuild is a no-op). Returns false with a
/// one-line \p error and no temporary files left; never throws.
bool writeFilesAtomically(const std::string &dir, const std::vector<std::pair<std::string, std::string>> &files,
                          std::string &error, bool keepIdentical = false);

/// writeFilesAtomically for one file at \p path.
bool writeFileAtomically(const std::string &path, const std::string &contents, std::string &error,
                         bool keepIdentical = false);

} // namespace adapt

#endif // ADAPT_PARSER_ATOMICFILE_H
