//===- McpTasks.h - the tasks extension (SEP-2663) --------------*- C++ -*-===//
//
// Task-augmented tools/call: a tool call that runs on its own thread and is
// observed through tasks/get (status, then the inlined result or error),
// answered through tasks/update (the client's input when the task parks in
// input_required) and stopped through tasks/cancel. Protocol-only.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_MCPTASKS_H
#define ADAPT_AGENT_MCP_MCPTASKS_H

#include "agent/mcp/McpRegistry.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace adapt::mcp {

/// True when CAPABILITIES (a client capabilities object) declare the tasks
/// extension under `extensions`.
bool declaresTasks(const json &capabilities);

/// The -32021 error for a client that did not declare the tasks extension.
RpcError tasksNotNegotiated(const std::string &what);

struct TaskRecord;

/// All tasks of one server. Task ids are 128-bit random hex strings: the id
/// is the handle (stateless clients have no session to bind a task to).
class TaskStore {
public:
  /// Called on every status change with the task's session id (empty for a
  /// stateless caller) and a notifications/tasks message.
  using Notify =
      std::function<void(const std::string &sessionId, const json &message)>;
  /// Runs the tool with a context; returns its CallToolResult or throws
  /// RpcError (a protocol-level failure: the task fails).
  using Work = std::function<json(CallContext &context)>;

  explicit TaskStore(Notify notify) : notify(std::move(notify)) {}
  ~TaskStore() { shutdown(); }

  /// Creates a task running WORK on its own thread and returns the
  /// CreateTaskResult. The task exists (tasks/get resolves it) before this
  /// returns. PARAMS, META and CAPABILITIES are those of the tools/call.
  json create(Work work, const json &params, const json &meta,
              const json &capabilities, const std::string &sessionId);
  /// tasks/get: the DetailedTask; -32602 for an unknown id.
  json get(const std::string &taskId);
  /// tasks/update: delivers RESPONSES (key -> result) to the parked task;
  /// keys it is not waiting for are ignored. -32602 for an unknown id.
  void update(const std::string &taskId, const json &responses);
  /// tasks/cancel: a running task becomes cancelled (its work is told to
  /// stop and its outcome discarded); a finished one is left as it is.
  void cancel(const std::string &taskId);
  /// Cancels every running task and waits (at most a few seconds) for their
  /// threads, so that shutdown never hangs.
  void shutdown();

  /// How long a task stays readable after it was created.
  static constexpr int64_t kTtlMs = 3600 * 1000;
  /// How often a client is advised to poll tasks/get.
  static constexpr int64_t kPollIntervalMs = 500;

private:
  friend class TaskContext;
  Notify notify;
  std::mutex mutex;
  std::condition_variable changed;
  std::unordered_map<std::string, std::shared_ptr<TaskRecord>> tasks;
  int running = 0;
  std::atomic<bool> stopping{false};

  std::shared_ptr<TaskRecord> find(const std::string &taskId);
  /// Sets STATUS (under the lock) and sends the notification (outside it).
  void setStatus(TaskRecord &task, const std::string &status,
                 std::unique_lock<std::mutex> &lock);
  /// Drops tasks older than kTtlMs that are no longer running.
  void forgetExpired();
  void runTask(std::shared_ptr<TaskRecord> task, Work work);
};

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_MCPTASKS_H
