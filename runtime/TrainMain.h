//===- TrainMain.h - the command line of a generated trainer ---*- C++ -*-===//
//
// A generated trainer program (`DIR/train`) is a main() that fills a
// ModelDef and calls trainMain; everything else, flags included, lives in
// the runtime so that every generated trainer behaves the same.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TRAINMAIN_H
#define ADAPT_RUNTIME_TRAINMAIN_H

#include "runtime/ModelDef.h"

#include <string>
#include <vector>

namespace adapt::rt {

/// Runs the trainer CLI (`--help` lists the flags and exit codes) for the
/// model \p def, whose weights are in \p defaultModelDir unless --model
/// says otherwise. Returns the process exit code: 0 success, 1 internal
/// (LibTorch) failure, 2 bad input, 5 diverged, 6 write failure, 130
/// interrupted after a checkpoint. Errors print one line on stderr:
/// "error: FILE: FIELD: expected ...".
int trainMain(int argc, char **argv, const ModelDef &def, const std::string &defaultModelDir);

/// The --help text of a trainer called \p program.
std::string trainUsage(const std::string &program, const std::string &defaultModelDir);

/// Every flag trainMain accepts ("--steps", ...; "-h" too), value-taking or
/// not: what --help must document.
std::vector<std::string> trainFlags();

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_TRAINMAIN_H
