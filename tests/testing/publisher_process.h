// A publisher in a child process, driven line by line over its command loop (testing/
// command_loop.h): ws_publisher (tests/helpers/publisher_main.cc) for host tensors,
// ws_gpu_publisher (gpu_publisher_main.cc) for CUDA tensors. Started on an endpoint — a
// tcp://HOST:0 one gets its port, kept when the publisher is started again after a kill — then
// told to publish steps of the synthetic model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::testing {

class PublisherProcess {
 public:
  // `helper`: "publisher" or "gpu_publisher"; `args`: its arguments after the endpoint
  // (TENSORS ELEMENTS [...]); `env`: "K=V" entries added to its environment.
  PublisherProcess(std::string helper, std::vector<std::string> args,
                   std::vector<std::string> env = {});
  // Starts the helper on `endpoint` (replacing one still running) and waits for "ready"; from
  // then on endpoint() is the endpoint it bound. Call through ASSERT_NO_FATAL_FAILURE.
  void Start(const std::string& endpoint);
  // "publish S" answered "ok S". Call through ASSERT_NO_FATAL_FAILURE.
  void Publish(int64_t step);
  const std::string& endpoint() const { return endpoint_; }
  ChildProcess& process() { return process_; }

 private:
  std::string helper_;
  std::vector<std::string> args_, env_;
  std::string endpoint_;
  ChildProcess process_;
};

// Waits (bounded) until the fail point `point` has fired `hits` times; false if it never did.
bool WaitForFailPointHits(const char* point, int64_t hits = 1, int timeout_ms = 10000);

}  // namespace weightsync::testing
