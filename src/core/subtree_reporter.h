// SubtreeReporter: a relay tells its parent how its subtree changed between its own updates
// (docs/relays.md, "Membership"). Its serving publisher says when a child joined, left, asked for
// a step or reported (Changed); a thread of its own then sends one report for everything that
// changed within `coalesce`, so a tree of N replicas costs its trainer at most one report per
// direct relay per `coalesce`, not one per event below. An update reports at its end anyway
// (Snapshot, then Reported with what it covered), and the thread sends nothing that update
// already said.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "util/mutex.h"

namespace weightsync::core {

class SubtreeReporter {
 public:
  // `send` reports now if it can; false when the subscriber is busy (an update holds it), and
  // the reporter tries again `coalesce` later.
  SubtreeReporter(std::function<bool()> send, std::chrono::milliseconds coalesce);
  ~SubtreeReporter();  // Stop()
  SubtreeReporter(const SubtreeReporter&) = delete;
  SubtreeReporter& operator=(const SubtreeReporter&) = delete;

  void Changed();  // any thread
  // For a report sent elsewhere: how many changes it covers (taken before it is built), and
  // that it was sent.
  uint64_t Snapshot() const;
  void Reported(uint64_t covered);
  // Ends the thread (waits for a send in progress); Changed() does nothing after. Idempotent.
  void Stop();

 private:
  void Run();

  std::function<bool()> send_;
  const std::chrono::milliseconds coalesce_;
  mutable util::Mutex mu_;
  util::CondVar cv_;
  uint64_t changes_ WS_GUARDED_BY(mu_) = 0;
  uint64_t reported_ WS_GUARDED_BY(mu_) = 0;
  bool stop_ WS_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace weightsync::core
