//===- McpTasks.cpp - the tasks extension (SEP-2663) ----------------------===//
//
// Each task runs its tool on a detached thread with a TaskContext. Asking the
// client something parks the task in input_required with the request in
// `inputRequests` under a server-minted key; tasks/update delivers the answer
// and the thread resumes. A cancelled task keeps the status `cancelled`
// whatever its thread returns afterwards.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/McpTasks.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <thread>

namespace adapt::mcp {

/// One task: its status and, once finished, its result or error.
struct TaskRecord {
  std::string id, sessionId, status = "working", statusMessage;
  std::string createdAt, lastUpdatedAt;
  std::chrono::steady_clock::time_point created;
  json result, error;                    ///< null until completed / failed
  json inputRequests = json::object();   ///< minted key -> {method, params}
  json inputResponses = json::object();  ///< answered, not yet taken
  std::atomic<bool> cancelled{false};
  bool threadDone = false;
  unsigned nextKey = 0;
  json params, meta, capabilities;
};

namespace {

/// Most tasks running at once; more get an error instead of a thread.
constexpr int kMaxRunningTasks = 128;

bool terminal(const std::string &status) {
  return status == "completed" || status == "failed" || status == "cancelled";
}

/// Now as ISO-8601 UTC with milliseconds.
std::string isoNow() {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          now.time_since_epoch())
          .count() %
      1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", text, millis);
  return out;
}

std::string randomTaskId() {
  static thread_local std::mt19937_64 engine{std::random_device{}()};
  static const char *digits = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i)
    out += digits[engine() & 15];
  return out;
}

/// The Task fields every task answer carries.
json taskFields(const TaskRecord &task) {
  json fields = {{"taskId", task.id},
                 {"status", task.status},
                 {"createdAt", task.createdAt},
                 {"lastUpdatedAt", task.lastUpdatedAt},
                 {"ttlMs", TaskStore::kTtlMs},
                 {"pollIntervalMs", TaskStore::kPollIntervalMs}};
  if (!task.statusMessage.empty())
    fields["statusMessage"] = task.statusMessage;
  return fields;
}

/// The DetailedTask: fields plus what the status carries.
json detailed(const TaskRecord &task) {
  json out = taskFields(task);
  out["resultType"] = "complete";
  if (task.status == "input_required")
    out["inputRequests"] = task.inputRequests;
  if (task.status == "completed")
    out["result"] = task.result;
  if (task.status == "failed")
    out["error"] = task.error;
  return out;
}

} // namespace

bool declaresTasks(const json &capabilities) {
  return capabilities.is_object() && capabilities.contains("extensions") &&
         capabilities["extensions"].is_object() &&
         capabilities["extensions"].contains(kTasksExtension);
}

RpcError tasksNotNegotiated(const std::string &what) {
  return RpcError(kMissingClientCapability,
                  what + " needs the " + std::string(kTasksExtension) +
                      " extension in the client capabilities",
                  json{{"requiredCapabilities",
                        {{"extensions", {{kTasksExtension, json::object()}}}}}});
}

/// The CallContext of a task: input requests park the task.
class TaskContext : public CallContext {
public:
  TaskContext(TaskStore &store, std::shared_ptr<TaskRecord> task)
      : store(store), task(std::move(task)) {}

  void progress(double, std::optional<double>,
                const std::string &message) override {
    if (message.empty())
      return;
    std::lock_guard<std::mutex> lock(store.mutex);
    task->statusMessage = message;
  }
  void log(const std::string &, const json &) override {}

  json requestClient(const std::string &method, const json &params) override {
    json answers = requestClientAll(
        json{{"request", {{"method", method}, {"params", params}}}});
    return answers["request"];
  }

  json requestClientAll(const json &requests) override {
    std::unique_lock<std::mutex> lock(store.mutex);
    std::map<std::string, std::string> minted; // tool key -> wire key
    for (auto it = requests.begin(); it != requests.end(); ++it) {
      std::string key = "input-" + std::to_string(++task->nextKey);
      minted[it.key()] = key;
      task->inputRequests[key] = it.value();
    }
    store.setStatus(*task, "input_required", lock);
    auto answered = [&] {
      for (auto &entry : minted)
        if (!task->inputResponses.contains(entry.second))
          return false;
      return true;
    };
    while (!answered()) {
      if (task->cancelled || store.stopping)
        throw RpcError(kInternalError, "the task was cancelled");
      store.changed.wait_for(lock, std::chrono::milliseconds(200));
    }
    json results = json::object();
    for (auto &entry : minted) {
      results[entry.first] = task->inputResponses[entry.second];
      task->inputResponses.erase(entry.second);
    }
    return results;
  }

  bool cancelled() const override {
    return task->cancelled || store.stopping;
  }
  const json &clientCapabilities() const override { return task->capabilities; }
  const json &requestMeta() const override { return task->meta; }
  const json &requestParams() const override { return task->params; }
  /// A task can wait for input (it parks), so tools ask instead of
  /// answering input_required.
  bool stateless() const override { return false; }

private:
  TaskStore &store;
  std::shared_ptr<TaskRecord> task;
};

void TaskStore::setStatus(TaskRecord &task, const std::string &status,
                          std::unique_lock<std::mutex> &lock) {
  task.status = status;
  task.lastUpdatedAt = isoNow();
  json params = taskFields(task);
  if (status == "completed")
    params["result"] = task.result;
  if (status == "failed")
    params["error"] = task.error;
  if (status == "input_required")
    params["inputRequests"] = task.inputRequests;
  json message = {{"jsonrpc", "2.0"},
                  {"method", "notifications/tasks"},
                  {"params", params}};
  std::string sessionId = task.sessionId;
  changed.notify_all();
  if (sessionId.empty() || !notify)
    return;
  lock.unlock();
  notify(sessionId, message);
  lock.lock();
}

void TaskStore::forgetExpired() {
  auto now = std::chrono::steady_clock::now();
  for (auto it = tasks.begin(); it != tasks.end();) {
    bool old = now - it->second->created > std::chrono::milliseconds(kTtlMs);
    it = old && it->second->threadDone ? tasks.erase(it) : std::next(it);
  }
}

std::shared_ptr<TaskRecord> TaskStore::find(const std::string &taskId) {
  auto it = tasks.find(taskId);
  if (it == tasks.end())
    throw RpcError(kInvalidParams, "Unknown task: " + taskId,
                   json{{"taskId", taskId}});
  return it->second;
}

json TaskStore::create(Work work, const json &params, const json &meta,
                       const json &capabilities, const std::string &sessionId) {
  auto task = std::make_shared<TaskRecord>();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping)
      throw RpcError(kInternalError, "the server is shutting down");
    if (running >= kMaxRunningTasks)
      throw RpcError(kInternalError,
                     "too many running tasks (" +
                         std::to_string(kMaxRunningTasks) +
                         "); cancel some or wait");
    forgetExpired();
    task->id = randomTaskId();
    task->sessionId = sessionId;
    task->createdAt = task->lastUpdatedAt = isoNow();
    task->created = std::chrono::steady_clock::now();
    task->params = params;
    task->meta = meta;
    task->capabilities = capabilities;
    tasks[task->id] = task;
    ++running;
  }
  json created = taskFields(*task);
  created["resultType"] = "task";
  std::thread([this, task, work = std::move(work)] { runTask(task, work); })
      .detach();
  return created;
}

void TaskStore::runTask(std::shared_ptr<TaskRecord> task, Work work) {
  TaskContext context(*this, task);
  json outcome, error;
  try {
    outcome = work(context);
  } catch (const RpcError &failure) {
    error = {{"code", failure.code}, {"message", failure.what()}};
    if (!failure.data.is_null())
      error["data"] = failure.data;
  } catch (const std::exception &failure) {
    error = {{"code", kInternalError}, {"message", failure.what()}};
  }
  std::unique_lock<std::mutex> lock(mutex);
  task->inputRequests = json::object();
  if (!task->cancelled && !terminal(task->status)) {
    if (!error.is_null()) {
      task->error = error;
      setStatus(*task, "failed", lock);
    } else {
      task->result = outcome;
      setStatus(*task, "completed", lock);
    }
  }
  task->threadDone = true;
  --running;
  changed.notify_all();
}

json TaskStore::get(const std::string &taskId) {
  std::lock_guard<std::mutex> lock(mutex);
  return detailed(*find(taskId));
}

void TaskStore::update(const std::string &taskId, const json &responses) {
  std::unique_lock<std::mutex> lock(mutex);
  std::shared_ptr<TaskRecord> task = find(taskId);
  bool delivered = false;
  for (auto it = responses.begin(); it != responses.end(); ++it) {
    if (!task->inputRequests.contains(it.key()))
      continue; // not asked (or already answered): ignored
    task->inputResponses[it.key()] = it.value();
    task->inputRequests.erase(it.key());
    delivered = true;
  }
  if (delivered && task->status == "input_required" &&
      task->inputRequests.empty())
    setStatus(*task, "working", lock);
  changed.notify_all();
}

void TaskStore::cancel(const std::string &taskId) {
  std::unique_lock<std::mutex> lock(mutex);
  std::shared_ptr<TaskRecord> task = find(taskId);
  if (terminal(task->status))
    return;
  task->cancelled = true;
  task->inputRequests = json::object();
  setStatus(*task, "cancelled", lock);
}

void TaskStore::shutdown() {
  std::unique_lock<std::mutex> lock(mutex);
  stopping = true;
  changed.notify_all();
  changed.wait_for(lock, std::chrono::seconds(10), [this] { return running == 0; });
}

} // namespace adapt::mcp
