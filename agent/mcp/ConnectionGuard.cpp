//===- ConnectionGuard.cpp - slow and idle clients cannot starve others ---===//
//
// httplib's accept loop hands the accepted socket to the task queue inside a
// closure, so the guard finds it itself: the one connected socket of the
// server's port that it does not track yet (sockets are told apart by inode,
// never by descriptor number, which the kernel reuses). It keeps a duplicate
// descriptor of each, so shutting one down can never hit a reused number.
//
//===----------------------------------------------------------------------===//

#include "agent/mcp/ConnectionGuard.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace adapt::mcp {

using Clock = std::chrono::steady_clock;

/// One accepted connection.
struct ConnectionGuard::Connection {
  int fd = -1;              ///< our duplicate of the socket
  ino_t inode = 0;          ///< identity of the socket
  Clock::time_point waitingSince; ///< accepted, or its last response written
  bool busy = false;        ///< a handler runs for it
  bool closed = false;      ///< shut down by the guard
};

namespace {

/// The connection (and its guard) a worker thread serves now.
thread_local ConnectionGuard *currentGuard = nullptr;
thread_local std::shared_ptr<ConnectionGuard::Connection> currentConnection;

/// The port a socket is bound to (IPv4 or IPv6), or -1.
int localPort(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&address), &size) != 0)
    return -1;
  if (address.ss_family == AF_INET)
    return ntohs(reinterpret_cast<sockaddr_in *>(&address)->sin_port);
  if (address.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<sockaddr_in6 *>(&address)->sin6_port);
  return -1;
}

/// Answers STATUS on the connection (best effort, never blocks) and shuts it
/// down: httplib's worker then reads end-of-file and closes it.
void shutDown(ConnectionGuard::Connection &connection, const char *statusLine) {
  if (connection.closed)
    return;
  connection.closed = true;
  std::string reply = std::string("HTTP/1.1 ") + statusLine +
                      "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
  (void)!send(connection.fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(connection.fd, SHUT_RDWR);
}

} // namespace

/// httplib's thread pool, with each connection registered on accept and
/// forgotten when its worker is done with it.
class GuardedQueue : public httplib::TaskQueue {
public:
  GuardedQueue(ConnectionGuard &guard, int threads) : guard(guard), pool(threads) {}

  void enqueue(std::function<void()> serve) override {
    std::shared_ptr<ConnectionGuard::Connection> connection = guard.identifyAccepted();
    if (!connection) {
      pool.enqueue(std::move(serve));
      return;
    }
    guard.admit(connection);
    ConnectionGuard *owner = &guard;
    pool.enqueue([owner, connection, serve = std::move(serve)] {
      currentGuard = owner;
      currentConnection = connection;
      serve();
      currentGuard = nullptr;
      currentConnection.reset();
      owner->forget(connection);
    });
  }

  void shutdown() override {
    guard.closeAll();
    pool.shutdown();
  }

private:
  ConnectionGuard &guard;
  httplib::ThreadPool pool;
};

ConnectionGuard::ConnectionGuard(ConnectionLimits limits, int listeningSocket)
    : limits(limits), listeningSocket(listeningSocket) {
  watchdog = std::thread([this] { watch(); });
}

ConnectionGuard::~ConnectionGuard() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopped = true;
  }
  stopping.notify_all();
  watchdog.join();
  for (const auto &connection : open)
    close(connection->fd);
}

httplib::TaskQueue *ConnectionGuard::newTaskQueue(int threads) {
  return new GuardedQueue(*this, threads);
}

std::shared_ptr<ConnectionGuard::Connection> ConnectionGuard::identifyAccepted() {
  const int port = localPort(listeningSocket);
  struct stat listening {};
  if (port < 0 || fstat(listeningSocket, &listening) != 0)
    return nullptr;
  std::vector<ino_t> known;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto &connection : open)
      known.push_back(connection->inode);
  }
  DIR *fds = opendir("/proc/self/fd");
  if (!fds)
    return nullptr;
  int found = -1;
  ino_t foundInode = 0;
  while (dirent *entry = readdir(fds)) {
    char *end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(fds))
      continue;
    struct stat info {};
    if (fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode) ||
        info.st_ino == listening.st_ino ||
        std::find(known.begin(), known.end(), info.st_ino) != known.end())
      continue;
    sockaddr_storage peer{};
    socklen_t size = sizeof peer;
    if (localPort(static_cast<int>(fd)) != port ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&peer), &size) != 0)
      continue;
    // The newest socket has the largest inode (sockfs numbers them in order).
    if (found < 0 || info.st_ino > foundInode) {
      found = static_cast<int>(fd);
      foundInode = info.st_ino;
    }
  }
  closedir(fds);
  if (found < 0)
    return nullptr;
  auto connection = std::make_shared<Connection>();
  connection->fd = fcntl(found, F_DUPFD_CLOEXEC, 0);
  if (connection->fd < 0)
    return nullptr;
  connection->inode = foundInode;
  connection->waitingSince = Clock::now();
  return connection;
}

void ConnectionGuard::admit(const std::shared_ptr<Connection> &connection) {
  std::lock_guard<std::mutex> lock(mutex);
  int live = 0;
  Connection *longestWaiting = nullptr;
  for (const auto &other : open) {
    if (other->closed)
      continue;
    ++live;
    if (!other->busy &&
        (!longestWaiting || other->waitingSince < longestWaiting->waitingSince))
      longestWaiting = other.get();
  }
  if (live >= limits.maxConnections) {
    if (longestWaiting)
      shutDown(*longestWaiting, "503 Service Unavailable");
    else
      shutDown(*connection, "503 Service Unavailable");
  }
  open.push_back(connection);
}

void ConnectionGuard::forget(const std::shared_ptr<Connection> &connection) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = std::find(open.begin(), open.end(), connection);
  if (it != open.end())
    open.erase(it);
  close(connection->fd);
  connection->fd = -1;
}

void ConnectionGuard::requestRead() {
  if (!currentGuard || !currentConnection)
    return;
  std::lock_guard<std::mutex> lock(currentGuard->mutex);
  currentConnection->busy = true;
}

void ConnectionGuard::responseWritten() {
  if (!currentGuard || !currentConnection)
    return;
  std::lock_guard<std::mutex> lock(currentGuard->mutex);
  currentConnection->busy = false;
  currentConnection->waitingSince = Clock::now();
}

void ConnectionGuard::closeAll() {
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto &connection : open) {
    connection->busy = false;
    shutDown(*connection, "503 Service Unavailable");
  }
}

void ConnectionGuard::watch() {
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopped) {
    stopping.wait_for(lock, std::chrono::milliseconds(200));
    const Clock::time_point now = Clock::now();
    for (const auto &connection : open)
      if (!connection->busy && now - connection->waitingSince > limits.requestTimeout)
        shutDown(*connection, "408 Request Timeout");
  }
}

} // namespace adapt::mcp
