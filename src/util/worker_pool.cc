#include "util/worker_pool.h"

#include <algorithm>

#include "util/ledger.h"
#include "util/logging.h"
#include "util/thread.h"

namespace weightsync::util {

int DefaultThreads() {
  unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hw, 1, 4));
}

int HashThreads() {
  unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hw, 1, 16));
}

WorkerPool::WorkerPool(int threads) {
  threads = std::max(threads, 1);
  workers_.reserve(threads - 1);
  for (int i = 0; i < threads - 1; ++i) {
    std::thread t;
    if (Status s = StartThread(&t, "copy worker", [this] { WorkerLoop(); }); !s.ok()) {
      // Fewer workers is slower, not wrong: the caller of Run always works too.
      WS_LOG(WARN, "pool") << s << "; continuing with " << workers_.size() + 1 << " of "
                           << threads << " threads";
      break;
    }
    workers_.push_back(std::move(t));
    LedgerAdd(LedgerItem::kThreads, 1);
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) {
    t.join();
    LedgerAdd(LedgerItem::kThreads, -1);
  }
}

void WorkerPool::Drain() {
  // Relaxed: the mutex handoff in Run publishes fn_/context_/count_ before any index is claimed.
  for (uint32_t i = next_.fetch_add(1, std::memory_order_relaxed); i < count_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    fn_(context_, i);
  }
}

void WorkerPool::WorkerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++active_;
    lock.unlock();
    Drain();
    lock.lock();
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void WorkerPool::Run(uint32_t count, TaskFn fn, void* context) {
  if (count == 0) return;
  if (workers_.empty() || count == 1) {
    for (uint32_t i = 0; i < count; ++i) fn(context, i);
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A worker that woke late for the previous job may still be inside Drain(); let it leave
    // before this job's fields change.
    done_cv_.wait(lock, [&] { return active_ == 0; });
    fn_ = fn;
    context_ = context;
    count_ = count;
    next_.store(0, std::memory_order_relaxed);
    ++generation_;
    ++active_;  // the caller
  }
  start_cv_.notify_all();
  Drain();
  std::unique_lock<std::mutex> lock(mu_);
  --active_;
  // Workers that woke late find no index left and leave at once; wait for all to leave so the
  // next Run cannot race with a worker still reading this job's fields.
  done_cv_.wait(lock, [&] { return active_ == 0; });
}

}  // namespace weightsync::util
