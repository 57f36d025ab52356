// The demo's lockstep between its two processes, over two pipes:
//   publisher → subscriber: Published{step, ...} after Publish(step) returned;
//   subscriber → publisher: Done{step, ok} after the subscriber updated to and checked the step.
// Messages are fixed-size structs (both ends are the same binary) written atomically (smaller than
// PIPE_BUF). Every read has a deadline; a closed pipe means the peer exited.
#pragma once

#include <chrono>
#include <cstdint>

#include "weightsync/status.h"

namespace weightsync::tools {

struct PublishedMessage {
  int64_t step = 0;
  double fill_seconds = 0;           // time to write the step's weights into the trainer's tensors
  double publish_seconds = 0;        // Publisher::Publish (copy into the slot + digests)
  uint64_t publish_allocations = 0;  // heap allocations in the publisher process during Publish
};

struct DoneMessage {
  int64_t step = 0;
  int32_t ok = 0;  // 1: updated and verified; 0: failed (the publisher stops)
};

Status WriteMessage(int fd, const void* message, size_t bytes);
// Reads exactly `bytes`; PeerLost on EOF, Timeout when the deadline passes.
Status ReadMessage(int fd, void* message, size_t bytes, std::chrono::milliseconds timeout);

}  // namespace weightsync::tools
