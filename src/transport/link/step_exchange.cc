#include "transport/link/step_exchange.h"

#include <unistd.h>

#include "util/fail_point.h"

namespace weightsync::transport::link {

wire::Hello SubscriberHello(const util::Deadline& deadline, const std::string& serves,
                            const std::string& avoid, const std::string& locality) {
  return wire::Hello{wire::kProtocolVersion,
                     wire::Role::kSubscriber,
                     static_cast<uint32_t>(::getpid()),
                     static_cast<uint64_t>(deadline.RemainingMs()),
                     serves,
                     avoid,
                     locality};
}

Result<int64_t> RequestStep(transport::link::Channel& channel, const std::string& peer,
                            std::optional<int64_t> step, int64_t after_step, wire::StepBegin* begin,
                            const util::Deadline& deadline, bool delta, uint32_t below) {
  wire::UpdateRequest req{step.value_or(-1), after_step,
                          static_cast<uint64_t>(deadline.RemainingMs()), delta, below};
  WS_RETURN_IF_ERROR(channel.Send(wire::FrameType::kUpdateRequest, req, deadline));
  WS_RETURN_IF_ERROR(channel.ReceiveReply(wire::FrameType::kStepBegin, begin, deadline));
  if (begin->step == after_step) return begin->step;  // up to date; the publisher pinned nothing
  if (begin->step < after_step || (step && begin->step != *step)) {
    return Status::ProtocolError(peer, ": asked for step ",
                                 step ? std::to_string(*step) : std::string("latest"), " after ",
                                 after_step, ", publisher offered step ", begin->step);
  }
  return begin->step;
}

Result<std::span<const uint64_t>> ReceiveStepEnd(transport::link::Channel& channel,
                                                 const std::string& peer, int64_t step,
                                                 uint32_t digest_count, wire::StepEnd* end,
                                                 const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(channel.ReceiveReply(wire::FrameType::kStepEnd, end, deadline));
  if (end->step != step) {
    return Status::ProtocolError(peer, ": step end for step ", end->step, ", expected ", step);
  }
  if (end->digests.size() != digest_count) {
    return Status::ProtocolError(peer, ": step ", end->step, " carries ", end->digests.size(),
                                 " digests, the plan needs ", digest_count);
  }
  return std::span<const uint64_t>(end->digests);
}

Result<uint32_t> ReceiveBucketReady(transport::link::Channel& channel, const std::string& peer,
                                    int64_t step, uint32_t bucket, uint32_t slot_count,
                                    const util::Deadline& deadline) {
  if (slot_count == 0)
    return Status::InvalidArgument("ring bucket ", bucket, ": a ring of 0 slots");
  wire::RingBucket ready;
  WS_RETURN_IF_ERROR(channel.ReceiveReply(wire::FrameType::kRingBucketReady, &ready, deadline));
  if (ready.step != step || ready.bucket != bucket) {
    return Status::ProtocolError(peer, ": ring bucket ", ready.bucket, " of step ", ready.step,
                                 " announced, expected bucket ", bucket, " of step ", step);
  }
  // Bucket b always streams through slot b % slot_count: the subscriber's copies are prepared so.
  if (ready.slot != bucket % slot_count) {
    return Status::ProtocolError(peer, ": ring bucket ", bucket, " in slot ", ready.slot,
                                 ", expected slot ", bucket % slot_count, " of the ring's ",
                                 slot_count);
  }
  // Tests: a subscriber slow inside the ring (sleep), holding the bucket it was given.
  (void)util::FailPoints::Check("subscriber.ring_bucket");
  return ready.slot;
}

Status SendBucketDone(transport::link::Channel& channel, int64_t step, uint32_t bucket,
                      uint32_t slot, const util::Deadline& deadline) {
  wire::RingBucket done{step, bucket, slot};
  // Tests: a done that does not echo the ready, which the publisher must refuse.
  if (util::FailPoints::Check("subscriber.ring_bad_done").action == util::FailAction::kFlip) {
    ++done.bucket;
  }
  return channel.Send(wire::FrameType::kRingBucketDone, done, deadline);
}

}  // namespace weightsync::transport::link
