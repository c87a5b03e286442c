//===- Isolated.cpp - run a command in-process, in a forked child ---------===//

#include "agent/mcp/Isolated.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <iostream>
#include <poll.h>
#include <stdexcept>
#include <stdio_ext.h>
#include <sys/wait.h>
#include <unistd.h>

namespace adapt::mcp {
namespace {

void appendBounded(std::string &into, const char *data, size_t size) {
  into.append(data, size);
  if (into.size() > kMaxIsolatedOutput)
    into.erase(0, into.size() - kMaxIsolatedOutput);
}

/// Calls \p body in the child. noexcept: an exception escaping it ends the
/// child right here (std::terminate prints its what(), then SIGABRT) instead
/// of unwinding into the server's code that forked it.
int callEndingOnException(const std::function<int()> &body) noexcept { return body(); }

/// The child's side: its own process group and descriptors, then the body.
[[noreturn]] void runChild(const std::function<int()> &body, int outFd, int errFd) {
  setpgid(0, 0);
  // Whatever the server had buffered is the server's, not this call's output.
  __fpurge(stdout);
  __fpurge(stderr);
  int null = open("/dev/null", O_RDONLY);
  if (null < 0 || dup2(null, 0) < 0 || dup2(outFd, 1) < 0 || dup2(errFd, 2) < 0)
    _exit(71);
  // The server's sockets and files are not the command's to hold open.
  close_range(3, ~0U, 0);
  signal(SIGPIPE, SIG_DFL);
  int code = callEndingOnException(body);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(code);
}

} // namespace

IsolatedResult runIsolated(const std::function<int()> &body, CallContext &context,
                           const std::string &label) {
  int outPipe[2], errPipe[2];
  if (pipe2(outPipe, O_CLOEXEC) != 0)
    throw std::runtime_error("cannot create pipes: " + std::string(strerror(errno)));
  if (pipe2(errPipe, O_CLOEXEC) != 0) {
    int saved = errno;
    close(outPipe[0]);
    close(outPipe[1]);
    throw std::runtime_error("cannot create pipes: " + std::string(strerror(saved)));
  }
  pid_t pid = fork();
  if (pid == 0)
    runChild(body, outPipe[1], errPipe[1]);
  close(outPipe[1]);
  close(errPipe[1]);
  if (pid < 0) {
    int saved = errno;
    close(outPipe[0]);
    close(errPipe[0]);
    throw std::runtime_error("cannot start " + label + ": " + strerror(saved));
  }
  // Both sides set the group, so a cancel right after the fork reaches it.
  setpgid(pid, pid);
  IsolatedResult result;
  pollfd fds[2] = {{outPipe[0], POLLIN, 0}, {errPipe[0], POLLIN, 0}};
  int open = 2;
  auto start = std::chrono::steady_clock::now();
  int lastBeat = -1;
  context.progress(0, std::nullopt, label + ": started");
  while (open > 0) {
    int ready = poll(fds, 2, 200);
    if (ready < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      char buffer[8192];
      ssize_t got = read(fds[i].fd, buffer, sizeof buffer);
      if (got > 0) {
        appendBounded(i == 0 ? result.stdoutText : result.stderrText, buffer, got);
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
    int seconds = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count());
    if (seconds != lastBeat && seconds > 0) {
      lastBeat = seconds;
      context.progress(seconds, std::nullopt,
                       label + ": running for " + std::to_string(seconds) + " s");
    }
    if (context.cancelled() && !result.cancelled) {
      result.cancelled = true;
      kill(-pid, SIGTERM);
    }
  }
  for (pollfd &fd : fds)
    if (fd.fd >= 0)
      close(fd.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

} // namespace adapt::mcp
