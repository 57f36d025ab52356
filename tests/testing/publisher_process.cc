#include "testing/publisher_process.h"

#include <chrono>
#include <thread>
#include <utility>

#include "util/fail_point.h"

namespace weightsync::testing {

PublisherProcess::PublisherProcess(std::string helper, std::vector<std::string> args,
                                   std::vector<std::string> env)
    : helper_(std::move(helper)), args_(std::move(args)), env_(std::move(env)) {}

void PublisherProcess::Start(const std::string& endpoint) {
  std::vector<std::string> argv = {HelperPath(helper_), endpoint};
  argv.insert(argv.end(), args_.begin(), args_.end());
  process_ = ChildProcess::Spawn(argv, env_);
  // A GPU publisher creates its CUDA context first: give it time.
  const std::string ready = process_.ReadLine(60000);
  ASSERT_EQ(ready.rfind("ready ", 0), 0u) << helper_ << " on " << endpoint << ": " << ready;
  endpoint_ = ready.substr(6);
}

void PublisherProcess::Publish(int64_t step) {
  ASSERT_EQ(process_.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
}

bool WaitForFailPointHits(const char* point, int64_t hits, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (util::FailPoints::Hits(point) < hits) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace weightsync::testing
