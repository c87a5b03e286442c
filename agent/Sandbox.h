//===- Sandbox.h - confinement of LLM-written candidate code -----*- C++ -*-===//
//
// Every compile and every test run of a candidate an LLM wrote goes through
// here (docs/security.md#candidate-sandbox):
//  - bubblewrap: new user, PID, network, IPC, UTS and cgroup namespaces, no
//    capabilities, a new session; the process tree dies with the sandbox;
//  - a file system of /usr (read-only), the folders the tool needs
//    (LibTorch, the checker; read-only), a private /tmp, and one writable
//    folder (the attempt's); /etc, /home, /root and the caller's working
//    folder are absent;
//  - an empty environment (no API key, no tokens), PATH only;
//  - hard resource limits set by prlimit inside, which the candidate cannot
//    raise: address space, CPU seconds, file size, open files, processes;
//  - nobody (65534) inside its user namespace, the caller's uid outside
//    (bwrap needs no privilege that way, and the caller's own folders,
//    private ones included, can be bound): no capabilities, no view of
//    any other process, only the folders listed above.
// Without bubblewrap, candidate code is not run at all.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_SANDBOX_H
#define ADAPT_AGENT_SANDBOX_H

#include <cstdint>
#include <string>
#include <vector>

namespace adapt::agent {

/// What one sandboxed command may use.
struct SandboxLimits {
  std::string writable;               ///< The only writable folder.
  std::vector<std::string> readOnly;  ///< Extra folders visible read-only (absolute).
  int cpuSeconds = 60;                ///< RLIMIT_CPU.
  uint64_t addressSpaceMb = 6144;     ///< RLIMIT_AS.
  uint64_t fileSizeMb = 1024;         ///< RLIMIT_FSIZE.
  int openFiles = 256;                ///< RLIMIT_NOFILE.
  int processes = 256;                ///< RLIMIT_NPROC (per uid; see docs/security.md).
};

/// \p args wrapped in the sandbox; empty with \p why set when the sandbox
/// cannot be built (no bwrap or prlimit on this machine).
std::vector<std::string> sandboxCommand(const std::vector<std::string> &args, const SandboxLimits &limits,
                                        std::string &why);

/// The absolute folders named in compiler flags (-I, -isystem, -L,
/// -Wl,-rpath,), widened to their site-packages when inside one (a pip
/// LibTorch loads its CUDA libraries from sibling packages): what a compile
/// and a run of a candidate must see read-only.
std::vector<std::string> foldersOfFlags(const std::string &flags);

} // namespace adapt::agent

#endif // ADAPT_AGENT_SANDBOX_H
