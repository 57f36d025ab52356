// SessionThreads: the publisher's subscriber sessions, one thread each, whatever the link. Starts
// a session on an accepted connection, reaps the finished ones (their thread joined, socket
// closed) and, on Close, wakes and joins the rest. Counted in the ledger (threads, connections).
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "util/mutex.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"

namespace weightsync::transport::link {

class SessionThreads {
 public:
  ~SessionThreads() { CloseAll(); }
  // Runs `serve(fd)` on a thread of its own; the fd stays owned here (`serve` borrows it) so a
  // shutdown from CloseAll() always targets a live descriptor. On failure (no thread) the fd is
  // handed back through `refused` so the caller can tell the peer why.
  Status Start(util::UniqueFd fd, std::string_view what, std::function<void(int fd)> serve,
               util::UniqueFd* refused);
  // Joins the sessions that have ended.
  void ReapFinished();
  // Wakes every session (shutdown of its socket) and joins it.
  void CloseAll();
  int active() const { return active_.load(std::memory_order_relaxed); }

 private:
  struct Session {
    util::UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void Reap(bool all);

  util::Mutex mu_;
  std::list<std::unique_ptr<Session>> sessions_ WS_GUARDED_BY(mu_);
  std::atomic<int> active_{0};
};

}  // namespace weightsync::transport::link
