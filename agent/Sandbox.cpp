//===- Sandbox.cpp - confinement of LLM-written candidate code ------------===//

#include "agent/Sandbox.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"

#include <set>
#include <sstream>


namespace adapt::agent {

namespace {

/// nobody:nogroup on Debian.
constexpr unsigned kNobody = 65534;

std::string realDir(const std::string &path) {
  llvm::SmallString<256> real;
  if (llvm::sys::fs::real_path(path, real))
    return "";
  return std::string(real);
}

} // namespace

std::vector<std::string> foldersOfFlags(const std::string &flags) {
  std::set<std::string> out;
  std::istringstream words(flags);
  for (std::string w; words >> w;) {
    for (const char *prefix : {"-I", "-isystem", "-L", "-Wl,-rpath,"})
      if (w.rfind(prefix, 0) == 0 && w.size() > std::string(prefix).size()) {
        w = w.substr(std::string(prefix).size());
        break;
      }
    if (w.empty() || w[0] != '/')
      continue;
    std::string dir = realDir(w);
    if (dir.empty())
      continue;
    if (size_t site = dir.find("/site-packages/"); site != std::string::npos)
      dir = dir.substr(0, site + std::string("/site-packages").size());
    out.insert(dir);
  }
  return {out.begin(), out.end()};
}

std::vector<std::string> sandboxCommand(const std::vector<std::string> &args, const SandboxLimits &limits,
                                        std::string &why) {
  auto bwrap = llvm::sys::findProgramByName("bwrap");
  auto prlimit = llvm::sys::findProgramByName("prlimit");
  if (!bwrap || !prlimit) {
    why = std::string("no sandbox: ") + (!bwrap ? "bwrap (apt-get install bubblewrap)" : "prlimit (util-linux)") +
          " is missing, and candidate code never runs unconfined";
    return {};
  }
  std::vector<std::string> cmd;
  cmd.insert(cmd.end(), {*bwrap, "--unshare-all", "--unshare-user", "--uid", std::to_string(kNobody), "--gid",
                         std::to_string(kNobody), "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                         "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib",
                         "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin"});
  // What the compiler and the dynamic loader read outside /usr.
  for (const char *etc : {"/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d"})
    if (llvm::sys::fs::exists(etc))
      cmd.insert(cmd.end(), {"--ro-bind", etc, etc});
  cmd.insert(cmd.end(), {"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"});
  for (const std::string &dir : limits.readOnly)
    if (!dir.empty() && llvm::sys::fs::exists(dir))
      cmd.insert(cmd.end(), {"--ro-bind", dir, dir});
  cmd.insert(cmd.end(), {"--bind", limits.writable, limits.writable, "--chdir", limits.writable, "--clearenv",
                         "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", limits.writable, "--setenv",
                         "TMPDIR", "/tmp", "--", *prlimit,
                         "--as=" + std::to_string(limits.addressSpaceMb << 20),
                         "--cpu=" + std::to_string(limits.cpuSeconds),
                         "--fsize=" + std::to_string(limits.fileSizeMb << 20),
                         "--nofile=" + std::to_string(limits.openFiles),
                         "--nproc=" + std::to_string(limits.processes), "--"});
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

} // namespace adapt::agent
