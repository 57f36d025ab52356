#include "util/worker_pool.h"

#include <algorithm>
#include <utility>

#include "util/ledger.h"
#include "util/logging.h"
#include "util/thread.h"

namespace weightsync::util {
namespace {

thread_local uint32_t t_slot = 0;  // WorkerPool::Slot()

}  // namespace

uint32_t WorkerPool::Slot() { return t_slot; }

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
    const auto slot = static_cast<uint32_t>(i + 1);
    if (Status s = StartThread(&t, "copy worker", [this, slot] { WorkerLoop(slot); }); !s.ok()) {
      // Fewer workers is slower, not wrong: the caller of Run always works too.
      WS_LOG(WARN, "pool") << s << "; continuing with " << workers_.size() + 1 << " of " << threads
                           << " threads";
      break;
    }
    workers_.push_back(std::move(t));
    LedgerAdd(LedgerItem::kThreads, 1);
  }
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.NotifyAll();
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

void WorkerPool::WorkerLoop(uint32_t slot) {
  t_slot = slot;
  uint64_t seen = 0;
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && generation_ == seen) start_cv_.Wait(&mu_);
    if (stop_) return;
    seen = generation_;
    ++active_;
    mu_.Unlock();
    Drain();
    mu_.Lock();
    if (--active_ == 0) done_cv_.NotifyAll();
  }
}

void WorkerPool::Run(uint32_t count, TaskFn fn, void* context) {
  if (count == 0) return;
  // The caller is slot 0 for this job (it may itself be another pool's worker: restored after).
  struct CallerSlot {
    uint32_t saved = std::exchange(t_slot, 0);
    ~CallerSlot() { t_slot = saved; }
  } caller;
  if (workers_.empty() || count == 1) {
    for (uint32_t i = 0; i < count; ++i) fn(context, i);
    return;
  }
  {
    MutexLock lock(&mu_);
    // A worker that woke late for the previous job may still be inside Drain(); let it leave
    // before this job's fields change.
    while (active_ != 0) done_cv_.Wait(&mu_);
    fn_ = fn;
    context_ = context;
    count_ = count;
    next_.store(0, std::memory_order_relaxed);
    ++generation_;
    ++active_;  // the caller
  }
  start_cv_.NotifyAll();
  Drain();
  MutexLock lock(&mu_);
  --active_;
  // Workers that woke late find no index left and leave at once; wait for all to leave so the
  // next Run cannot race with a worker still reading this job's fields.
  while (active_ != 0) done_cv_.Wait(&mu_);
}

}  // namespace weightsync::util
