// The subscriber's half of one step on the control channel, the same for every transport:
// UpdateRequest → StepBegin (validated against what was asked), and StepEnd (validated against
// the step and the plan). Transport-specific checks (slot index, data path) stay in the handles.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "transport/link/channel.h"
#include "util/deadline.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::link {

// The subscriber's Hello: this protocol version, its pid, how long it waits for the publisher's
// layout (the time left of `deadline`), the endpoint it serves as a relay and the relay it just
// lost, and where it runs (wire::Hello::serves, avoid, locality; empty: none).
wire::Hello SubscriberHello(const util::Deadline& deadline, const std::string& serves,
                            const std::string& avoid, const std::string& locality);

// Asks for `step` (nullopt: latest) newer than `after_step`; fills `begin`. Returns the step
// offered; `after_step` means up to date. `delta`: the subscriber can apply a delta against
// `after_step` (UpdateRequest::delta; a DeltaBegin precedes the step's bytes). `below`: how many
// subscribers this one serves (UpdateRequest::below).
Result<int64_t> RequestStep(transport::link::Channel& channel, const std::string& peer,
                            std::optional<int64_t> step, int64_t after_step, wire::StepBegin* begin,
                            const util::Deadline& deadline, bool delta, uint32_t below);

// Receives the StepEnd of `step` into `end`; it must carry exactly `digest_count` digests.
Result<std::span<const uint64_t>> ReceiveStepEnd(transport::link::Channel& channel,
                                                 const std::string& peer, int64_t step,
                                                 uint32_t digest_count, wire::StepEnd* end,
                                                 const util::Deadline& deadline);

// Ring publishers: receives the announcement of bucket `bucket` of `step` and returns the ring
// slot it is in (bucket % slot_count); anything else is a ProtocolError naming what came.
Result<uint32_t> ReceiveBucketReady(transport::link::Channel& channel, const std::string& peer,
                                    int64_t step, uint32_t bucket, uint32_t slot_count,
                                    const util::Deadline& deadline);
// ... and says the bucket was read (its slot may be refilled).
Status SendBucketDone(transport::link::Channel& channel, int64_t step, uint32_t bucket,
                      uint32_t slot, const util::Deadline& deadline);

// A ring step on the subscriber's side, every path's: for each of the version's `buckets` in
// order, waits for its announcement, calls read(bucket, slot) — which returns once the slot's
// bytes are read, as the slot is refilled after the answer — and answers that it was read. The
// first error ends it (the publisher then revokes this reader). A template: a step allocates
// nothing (a std::function of a capturing lambda could).
template <typename Read>
Status ReadRingBuckets(transport::link::Channel& channel, const std::string& peer, int64_t step,
                       uint32_t buckets, uint32_t slot_count, const util::Deadline& deadline,
                       Read&& read) {
  for (uint32_t b = 0; b < buckets; ++b) {
    Result<uint32_t> slot = ReceiveBucketReady(channel, peer, step, b, slot_count, deadline);
    if (!slot.ok()) return slot.status();
    WS_RETURN_IF_ERROR(read(b, *slot));
    WS_RETURN_IF_ERROR(SendBucketDone(channel, step, b, *slot, deadline));
  }
  return Status::Ok();
}

}  // namespace weightsync::transport::link
