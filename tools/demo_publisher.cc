#include <chrono>
#include <cstdio>

#include "demo_roles.h"
#include "demo_tensors.h"
#include "harness/alloc_counter.h"
#include "step_pipe.h"
#include "weightsync/publisher.h"

namespace weightsync::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Status Serve(const DemoOptions& o) {
  WS_ASSIGN_OR_RETURN(DemoModel model, BuildDemoModel(o));
  WS_ASSIGN_OR_RETURN(Device device, ParseDemoDevice("publisher-device", PublisherDeviceText(o)));
  WS_ASSIGN_OR_RETURN(DemoTensors storage, DemoTensors::Create(model.tensors, device, 0));
  PublisherOptions po;
  po.endpoint = o.endpoint;
  po.slots = static_cast<int>(o.slots);
  po.copy_threads = static_cast<int>(o.copy_threads);
  po.timeout = std::chrono::milliseconds(o.timeout_ms);
  WS_ASSIGN_OR_RETURN(auto publisher, Publisher::Create(po));
  WS_RETURN_IF_ERROR(publisher->Register(storage.Views()));

  const auto timeout = std::chrono::milliseconds(o.timeout_ms);
  DoneMessage done;
  for (int64_t step = 1; step <= o.steps; ++step) {
    if (step > 1) {
      // Lockstep: publish the next version only after the subscriber holds this one, so the
      // subscriber receives every step (it could skip ahead to the latest otherwise).
      WS_RETURN_IF_ERROR(ReadMessage(o.ack_fd, &done, sizeof(done), timeout));
      if (!done.ok) return Status::Cancelled("subscriber reported a failure at step ", done.step);
    }
    PublishedMessage msg;
    msg.step = step;
    auto t0 = Clock::now();
    WS_RETURN_IF_ERROR(storage.Fill(step));
    msg.fill_seconds = Since(t0);
    bench::AllocCounts a0 = bench::ProcessAllocations();
    auto t1 = Clock::now();
    WS_RETURN_IF_ERROR(publisher->Publish(step));
    msg.publish_seconds = Since(t1);
    msg.publish_allocations = (bench::ProcessAllocations() - a0).allocations;
    WS_RETURN_IF_ERROR(WriteMessage(o.notify_fd, &msg, sizeof(msg)));
  }
  WS_RETURN_IF_ERROR(ReadMessage(o.ack_fd, &done, sizeof(done), timeout));
  if (!done.ok) return Status::Cancelled("subscriber reported a failure at step ", done.step);
  return publisher->Close();
}

}  // namespace

int RunDemoPublisher(const DemoOptions& options) {
  Status s = Serve(options);
  if (s.ok()) return 0;
  // A subscriber failure is reported by the subscriber; only say why the publisher stopped.
  std::fprintf(stderr, "demo publisher: %s\n", s.ToString().c_str());
  return s.code() == StatusCode::kCancelled ? 3 : 1;
}

}  // namespace weightsync::tools
