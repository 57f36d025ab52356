// A progress bar on stderr for long updates, drawn by its own thread.
//
// What it shows is time, not bytes: weightsync offers no progress callback, so the bar compares
// the elapsed wall time of the update in flight with an expectation given by the caller (the
// previous step's duration); the fraction is capped at 99% until End(). With no expectation (the
// first, preparing update) it shows elapsed time and a moving marker only. It appears only after
// an update has run for 200 ms, and is erased before the caller prints its step line.
//
// The drawing thread formats with integer arithmetic into a stack buffer and write(2)s it, so it
// does not allocate while an update is being measured; thread_allocations() lets the caller check.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace weightsync::tools {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  ~ProgressBar();

  // Starts showing progress for one update of `bytes` expected to take `expected_seconds`
  // (≤ 0: unknown).
  void Begin(int64_t step, uint64_t bytes, double expected_seconds);
  // Stops and erases the bar; returns once nothing more will be drawn for this update.
  void End();
  // Allocations the drawing thread has made so far (expected to stay 0).
  uint64_t thread_allocations() const { return thread_allocations_.load(); }

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  void Loop();
  void Draw(std::chrono::steady_clock::duration elapsed);  // holds mu_

  const bool enabled_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false;                          // guarded by mu_
  bool stop_ = false;                            // guarded by mu_
  bool drawn_ = false;                           // a bar is on screen; guarded by mu_
  int64_t step_ = 0;                             // guarded by mu_
  uint64_t bytes_ = 0;                           // guarded by mu_
  double expected_ = 0;                          // guarded by mu_
  std::chrono::steady_clock::time_point start_;  // guarded by mu_
  std::atomic<uint64_t> thread_allocations_{0};
  std::thread thread_;
};

}  // namespace weightsync::tools
