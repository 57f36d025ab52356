// UpdateStats: what one Subscriber::Update() did, returned on success.
#pragma once

#include <cstdint>

namespace weightsync {

struct UpdateStats {
  int64_t step = -1;             // version now committed
  uint64_t bytes = 0;            // bytes moved into destinations
  uint64_t tensors = 0;
  double seconds = 0;            // wall time of the whole update
  double gbps = 0;               // bytes / seconds / 1e9
  // Per-phase wall time.
  double prepare_seconds = 0;    // connect + handshake + plan + map (0 when reused)
  double wait_seconds = 0;       // waiting for the step to be published
  double copy_seconds = 0;       // copying into shadow or destinations
  double verify_seconds = 0;     // digest check (0 when not verified)
  double commit_seconds = 0;     // shadow → destinations (staged), and conversions
  bool handle_created = false;   // true if this update prepared a new transfer handle
  uint64_t prepare_count = 0;    // transfer handles prepared by this subscriber so far
  bool verified = false;         // every segment matched its digest
  bool up_to_date = false;       // the latest step was already committed; nothing moved
};

}  // namespace weightsync
