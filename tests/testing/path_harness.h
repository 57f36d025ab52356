// One data path (transport/path/data_path.h) driven by hand the way a TransferHandle drives it
// (src/transport/transport.cc), for the path-level tests (tests/transport/path/, tests/gpu/): a
// link connected to a real publisher, the plan for the destinations, the publisher told what to
// send, the path prepared with the context a handle gives it, then whole steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "transport/link/link.h"
#include "transport/path/data_path.h"
#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "weightsync/tensor_view.h"

namespace weightsync::testing {

class PathHarness {
 public:
  // `options`: the subscriber's (endpoint, token, mode, verify, copy threads).
  explicit PathHarness(SubscriberOptions options);
  ~PathHarness();

  // Connects to the publisher and plans `destinations` (registered as a Subscriber would).
  Status Connect(const std::vector<NamedTensor>& destinations);
  // What the handle hands the path; valid while the harness lives.
  transport::path::PathContext Context();
  // As TransferHandle::Prepare after choosing the path: Available, the publisher told what to
  // send, then the path's Prepare.
  Status Prepare(transport::path::DataPath& path);
  // One update's worth: BeginStep (the latest step), Copy, EndStep, Verify (when the options
  // verify), Commit. Returns the step moved.
  Result<int64_t> Step(transport::path::DataPath& path);

  transport::link::Link& link() { return *link_; }
  const wire::Welcome& welcome() const { return link_->welcome(); }
  // The publisher's store as it came with the Welcome (Unix links); a test may swap in another.
  util::UniqueFd& store_fd() { return store_fd_; }
  // Bounds every call; a test may replace it (an expired one, say).
  util::Deadline& deadline() { return deadline_; }

 private:
  SubscriberOptions options_;
  std::unique_ptr<transport::link::Link> link_;
  std::vector<plan::Destination> destinations_;
  plan::Plan plan_;
  util::UniqueFd store_fd_;
  util::Deadline deadline_{std::chrono::seconds(10)};
  int64_t committed_ = -1;
};

}  // namespace weightsync::testing
