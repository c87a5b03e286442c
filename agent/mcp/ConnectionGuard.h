//===- ConnectionGuard.h - slow and idle clients cannot starve others -*- C++ -*-===//
//
// cpp-httplib gives each connection a worker thread and bounds only each
// single read (SO_RCVTIMEO), so a client sending one byte every few seconds
// holds a worker forever, and a few hundred such clients block everyone
// (issue 14, slowloris). The guard tracks every accepted connection:
//  - a connection that has not delivered a whole request (headers and body)
//    within the request timeout of being accepted, or of its previous
//    response, is shut down;
//  - at most maxConnections are open; a new one beyond that evicts the
//    connection that has waited longest for its request, so clients that send
//    promptly are served whatever slow clients do; when every open
//    connection is busy in a handler, the new one gets HTTP 503.
// Time spent in a handler (a tool run, an SSE stream) never counts.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_AGENT_MCP_CONNECTIONGUARD_H
#define ADAPT_AGENT_MCP_CONNECTIONGUARD_H

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace adapt::mcp {

/// Limits on how long and how many connections clients may hold.
struct ConnectionLimits {
  int maxConnections = 128;                 ///< open connections at once
  std::chrono::milliseconds requestTimeout{20000}; ///< to deliver a request
};

/// Tracks httplib's connections; see the file comment.
class ConnectionGuard {
public:
  /// LISTENING_SOCKET identifies the server's accepted connections.
  ConnectionGuard(ConnectionLimits limits, int listeningSocket);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard &) = delete;
  ConnectionGuard &operator=(const ConnectionGuard &) = delete;

  /// A task queue for httplib (Server::new_task_queue) with THREADS workers
  /// that registers each connection as it is accepted.
  httplib::TaskQueue *newTaskQueue(int threads);

  /// Called by a handler on entry: its request has been read whole, and the
  /// connection is busy (never timed out or evicted) until its response is
  /// written.
  static void requestRead();
  /// Called once a response is written (httplib's logger): the connection
  /// now waits for its next request, timed from now.
  static void responseWritten();

  /// Shuts every open connection down (server stop), so workers return.
  void closeAll();

  struct Connection;

private:
  friend class GuardedQueue;
  void admit(const std::shared_ptr<Connection> &connection);
  void forget(const std::shared_ptr<Connection> &connection);
  std::shared_ptr<Connection> identifyAccepted();
  void watch();

  ConnectionLimits limits;
  int listeningSocket;
  std::mutex mutex;
  std::condition_variable stopping;
  bool stopped = false;
  std::vector<std::shared_ptr<Connection>> open;
  std::thread watchdog;
};

} // namespace adapt::mcp

#endif // ADAPT_AGENT_MCP_CONNECTIONGUARD_H
