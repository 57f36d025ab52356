// TcpStepReader: reads a step a host publisher streams on the connection (tcp, tcp-to-gpu) into
// a HostLanding's received bytes — whole, in one scatter-gather read into place, or as deltas
// (docs/deltas.md) applied onto what the landing holds when the core asked for them. Shared by the
// paths whose bytes cross a socket into host memory first; what happens to them next (a commit
// into host destinations, or a copy to the GPU) is the path's own.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "transport/link/link.h"
#include "transport/path/data_path.h"
#include "transport/path/delta_receiver.h"
#include "transport/path/host_landing.h"
#include "util/deadline.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class TcpStepReader {
 public:
  // `landing` (prepared) receives the bytes; `deltas_fit`: the step may come as deltas (the
  // landing's received bytes hold whole published tensors: DeltaReceiver::Fits or the like).
  // The link, plan, welcome and landing outlive this.
  void Prepare(const PathContext& ctx, HostLanding* landing, bool deltas_fit);
  // DataPath's delta hooks, for a path whose landing holds the committed version exactly when
  // `committed_here` (it committed the last step it read, and read none since).
  bool AcceptsDeltas(bool committed_here) const { return deltas_fit_ && committed_here; }
  void ExpectDeltas(int64_t base_step, std::span<const uint64_t> base_digests) {
    deltas_.Expect(base_step, base_digests);
  }
  DeltaReceipt receipt() const { return deltas_.expected() ? deltas_.receipt() : DeltaReceipt{}; }
  DeltaReceiver& deltas() { return deltas_; }
  const DeltaReceiver& deltas() const { return deltas_; }

  // The step's bytes into the landing: as deltas when ExpectDeltas named a base (deltas()), else
  // whole, shown to `observer` (cut-through relays; may be null) as they land. The fail point
  // tcp.before_data fires before the first byte is read.
  Status Read(const wire::StepBegin& begin, LandingObserver* observer,
              const util::Deadline& deadline);
  Status Release() { return deltas_.Release(); }

 private:
  link::Link* link_ = nullptr;
  const plan::Plan* plan_ = nullptr;
  HostLanding* landing_ = nullptr;
  std::vector<iovec> parts_;                // one per planned tensor, built at Prepare
  std::vector<LandingPart> landing_parts_;  // parts_ as a LandingObserver sees them
  DeltaReceiver deltas_;
  bool deltas_fit_ = false;
};

}  // namespace weightsync::transport::path
