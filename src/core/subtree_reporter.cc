#include "core/subtree_reporter.h"

#include <algorithm>
#include <utility>

namespace weightsync::core {

SubtreeReporter::SubtreeReporter(std::function<bool()> send, std::chrono::milliseconds coalesce)
    : send_(std::move(send)), coalesce_(coalesce), thread_([this] { Run(); }) {}

SubtreeReporter::~SubtreeReporter() { Stop(); }

void SubtreeReporter::Changed() {
  {
    util::MutexLock lock(&mu_);
    ++changes_;
  }
  cv_.NotifyAll();
}

uint64_t SubtreeReporter::Snapshot() const {
  util::MutexLock lock(&mu_);
  return changes_;
}

void SubtreeReporter::Reported(uint64_t covered) {
  util::MutexLock lock(&mu_);
  reported_ = std::max(reported_, covered);
}

void SubtreeReporter::Stop() {
  {
    util::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void SubtreeReporter::Run() {
  mu_.Lock();
  while (!stop_) {
    if (changes_ == reported_) {
      cv_.Wait(&mu_);
      continue;
    }
    // Let what changes together (a step reaching every child) go up as one report; a send the
    // subscriber was too busy for is tried again as late.
    const auto until = std::chrono::steady_clock::now() + coalesce_;
    for (auto now = std::chrono::steady_clock::now(); !stop_ && now < until;
         now = std::chrono::steady_clock::now()) {
      cv_.WaitFor(&mu_, until - now);
    }
    if (stop_) break;
    const uint64_t covered = changes_;
    mu_.Unlock();
    const bool sent = send_();
    mu_.Lock();
    if (sent) reported_ = std::max(reported_, covered);
  }
  mu_.Unlock();
}

}  // namespace weightsync::core
