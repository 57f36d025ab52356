// WorkerPool: a fixed set of threads, started once per transfer handle, that run index-parallel
// jobs. Run() allocates nothing: the job is a function pointer plus a context, and workers claim
// indices from an atomic counter. The calling thread works too.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "util/mutex.h"

namespace weightsync::util {

class WorkerPool {
 public:
  using TaskFn = void (*)(void* context, uint32_t index);

  // Starts `threads` - 1 workers (the caller of Run is the last one). threads ≥ 1.
  explicit WorkerPool(int threads);
  ~WorkerPool();  // joins all workers

  // Runs fn(context, i) for i in [0, count); returns when all are done. One caller at a time:
  // a second thread calling Run while a job runs may wait forever (its owner serializes calls).
  void Run(uint32_t count, TaskFn fn, void* context);
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Which of the pool's threads calls this, inside a task: 0 for the caller of Run, 1..size()-1
  // for the workers (0 outside any task). Lets a job keep scratch per thread, sized before the
  // first Run, instead of thread_local scratch that grows whenever a thread first meets a large
  // task (which depends on scheduling).
  static uint32_t Slot();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

 private:
  void WorkerLoop(uint32_t slot);
  void Drain();

  Mutex mu_;
  CondVar start_cv_;
  CondVar done_cv_;
  uint64_t generation_ WS_GUARDED_BY(mu_) = 0;
  int active_ WS_GUARDED_BY(mu_) = 0;  // workers inside the current job
  bool stop_ WS_GUARDED_BY(mu_) = false;
  // The job: written under mu_ before the generation moves, read by Drain() without it (the
  // mutex handoff publishes them before any index is claimed).
  TaskFn fn_ = nullptr;
  void* context_ = nullptr;
  uint32_t count_ = 0;
  std::atomic<uint32_t> next_{0};
  std::vector<std::thread> workers_;
};

// Threads to use when the option says 0.
int DefaultThreads();
// Threads for hashing on the CPU while (or after) a copy engine moves the bytes: hashing is
// compute-bound where copying is memory-bound, so up to 16 instead of 4.
int HashThreads();

}  // namespace weightsync::util
