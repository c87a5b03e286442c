//===- IsolatedTest.cpp - MCP tool calls run in a forked child -----------===//
//
// What the MCP server promises of a tool call (agent/mcp/Isolated.h): the
// command runs in-process but in a child of its own, so its crash, its
// exception or its flood of output ends the call, not the server; a cancel
// stops it and what it started.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/Isolated.h"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <unistd.h>

using namespace adapt::mcp;

namespace {

/// A call context that cancels once \p cancelAfterBeats progress reports
/// have arrived (never when negative), and counts the reports.
class TestContext : public CallContext {
public:
  explicit TestContext(int cancelAfterBeats = -1) : cancelAfter(cancelAfterBeats) {}
  void progress(double, std::optional<double>, const std::string &) override { ++beats; }
  void log(const std::string &, const json &) override {}
  json requestClient(const std::string &, const json &) override { return json::object(); }
  bool cancelled() const override { return cancelAfter >= 0 && beats > cancelAfter; }
  const json &clientCapabilities() const override { return empty; }
  const json &requestMeta() const override { return empty; }
  const json &requestParams() const override { return empty; }
  bool stateless() const override { return false; }
  int beats = 0;

private:
  int cancelAfter;
  json empty = json::object();
};

TEST(Isolated, ExitCodeAndBothStreamsComeBack) {
  TestContext context;
  IsolatedResult r = runIsolated(
      [] {
        std::cout << "to stdout\n";
        std::cerr << "to stderr\n";
        return 3;
      },
      context, "test");
  EXPECT_EQ(r.exitCode, 3);
  EXPECT_EQ(r.stdoutText, "to stdout\n");
  EXPECT_EQ(r.stderrText, "to stderr\n");
  EXPECT_FALSE(r.cancelled);
  EXPECT_GE(context.beats, 1); // the "started" report
}

TEST(Isolated, ACrashEndsTheCallNotTheCaller) {
  TestContext context;
  IsolatedResult r = runIsolated([]() -> int { std::abort(); }, context, "test");
  EXPECT_EQ(r.exitCode, 128 + SIGABRT);
  // Still here, and the next call runs.
  EXPECT_EQ(runIsolated([] { return 0; }, context, "test").exitCode, 0);
}

TEST(Isolated, AnEscapingExceptionEndsTheCallAsACrashDoes) {
  TestContext context;
  IsolatedResult r =
      runIsolated([]() -> int { throw std::runtime_error("boom"); }, context, "test");
  EXPECT_EQ(r.exitCode, 128 + SIGABRT);
  EXPECT_NE(r.stderrText.find("boom"), std::string::npos) << r.stderrText;
}

TEST(Isolated, OutputIsBoundedToItsTail) {
  TestContext context;
  IsolatedResult r = runIsolated(
      [] {
        std::string line(1023, 'x');
        for (int i = 0; i < 1024; ++i) // 1 MiB
          std::cout << line << "\n";
        std::cout << "last\n";
        return 0;
      },
      context, "test");
  EXPECT_EQ(r.stdoutText.size(), kMaxIsolatedOutput);
  EXPECT_EQ(r.stdoutText.substr(r.stdoutText.size() - 5), "last\n");
}

TEST(Isolated, ACancelStopsTheChildAndWhatItStarted) {
  TestContext context(/*cancelAfterBeats=*/1);
  // The body starts a grandchild; both would sleep far past the test's time.
  IsolatedResult r = runIsolated(
      [] {
        std::cout << "started " << std::flush;
        int rc = std::system("sleep 60");
        return rc == 0 ? 0 : 1;
      },
      context, "test");
  EXPECT_TRUE(r.cancelled);
  EXPECT_EQ(r.exitCode, 128 + SIGTERM);
  EXPECT_LT(context.beats, 10); // stopped after a second or two, not 60
}

TEST(Isolated, TheServersDescriptorsAreNotTheCommands) {
  int pipeEnds[2];
  ASSERT_EQ(pipe(pipeEnds), 0);
  TestContext context;
  const int fd = pipeEnds[1];
  IsolatedResult r =
      runIsolated([fd] { return write(fd, "x", 1) == 1 ? 0 : 9; }, context, "test");
  EXPECT_EQ(r.exitCode, 9); // closed in the child
  close(pipeEnds[0]);
  close(pipeEnds[1]);
}

} // namespace
