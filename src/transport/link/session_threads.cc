#include "transport/link/session_threads.h"

#include <sys/socket.h>

#include "util/ledger.h"
#include "util/thread.h"

namespace weightsync::transport::link {

using util::LedgerAdd;
using util::LedgerItem;

Status SessionThreads::Start(util::UniqueFd fd, std::string_view what,
                             std::function<void(int fd)> serve, util::UniqueFd* refused) {
  auto session = std::make_unique<Session>();
  session->fd = std::move(fd);
  Session* s = session.get();
  util::MutexLock lock(&mu_);
  active_.fetch_add(1, std::memory_order_relaxed);
  LedgerAdd(LedgerItem::kConnections, 1);
  Status started = util::StartThread(&s->thread, what, [this, s, serve = std::move(serve)] {
    serve(s->fd.get());
    active_.fetch_sub(1, std::memory_order_relaxed);
    LedgerAdd(LedgerItem::kConnections, -1);
    s->done.store(true, std::memory_order_release);
  });
  if (!started.ok()) {
    active_.fetch_sub(1, std::memory_order_relaxed);
    LedgerAdd(LedgerItem::kConnections, -1);
    *refused = std::move(s->fd);
    return started;
  }
  LedgerAdd(LedgerItem::kThreads, 1);
  sessions_.push_back(std::move(session));
  return Status::Ok();
}

void SessionThreads::ReapFinished() { Reap(false); }

void SessionThreads::CloseAll() { Reap(true); }

void SessionThreads::Reap(bool all) {
  std::list<std::unique_ptr<Session>> finished;
  {
    util::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (all || (*it)->done.load(std::memory_order_acquire)) {
        finished.push_back(std::move(*it));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : finished) {
    if (all && s->fd.valid()) ::shutdown(s->fd.get(), SHUT_RDWR);  // wakes a blocked session
    s->thread.join();
    LedgerAdd(LedgerItem::kThreads, -1);
  }
}

}  // namespace weightsync::transport::link
