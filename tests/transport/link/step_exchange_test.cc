// The subscriber's half of a ring step (step_exchange.h): a ring_bucket_ready must name the step
// and bucket asked for and the bucket's own slot (bucket % slots); anything else is a protocol
// error naming what came. Two channels on a socket pair, real frames.
#include "transport/link/step_exchange.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>

#include "testing/test_util.h"

namespace weightsync::transport::link {
namespace {

using util::Deadline;

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    publisher = std::make_unique<Channel>(util::UniqueFd(fds[0]), "subscriber");
    subscriber = std::make_unique<Channel>(util::UniqueFd(fds[1]), "publisher");
  }
  Result<uint32_t> Announce(wire::RingBucket ready, int64_t step, uint32_t bucket, uint32_t slots) {
    const Deadline deadline(std::chrono::milliseconds(2000));
    Status sent = publisher->Send(wire::FrameType::kRingBucketReady, ready, deadline);
    if (!sent.ok()) return sent;
    return ReceiveBucketReady(*subscriber, "publisher", step, bucket, slots, deadline);
  }
  std::unique_ptr<Channel> publisher, subscriber;
};

TEST(ReceiveBucketReady, TheBucketsOwnSlotOfTheStepAskedForIsAccepted) {
  Pair p;
  ASSERT_OK_AND_ASSIGN(uint32_t slot, p.Announce({7, 5, 1}, 7, 5, 2));
  EXPECT_EQ(slot, 1u);
  ASSERT_OK_AND_ASSIGN(slot, p.Announce({7, 5, 2}, 7, 5, 3));
  EXPECT_EQ(slot, 2u);
}

TEST(ReceiveBucketReady, AnotherStepBucketOrSlotIsAProtocolErrorNamingIt) {
  Pair p;
  EXPECT_STATUS_IS(kProtocolError, p.Announce({8, 5, 1}, 7, 5, 2).status(),
                   "ring bucket 5 of step 8 announced, expected bucket 5 of step 7");
  EXPECT_STATUS_IS(kProtocolError, p.Announce({7, 6, 0}, 7, 5, 2).status(),
                   "ring bucket 6 of step 7 announced, expected bucket 5 of step 7");
  EXPECT_STATUS_IS(kProtocolError, p.Announce({7, 5, 0}, 7, 5, 2).status(),
                   "ring bucket 5 in slot 0, expected slot 1 of the ring's 2");
}

TEST(SendBucketDone, EchoesTheBucketItWasGiven) {
  Pair p;
  const Deadline deadline(std::chrono::milliseconds(2000));
  ASSERT_OK(SendBucketDone(*p.subscriber, 7, 5, 1, deadline));
  wire::RingBucket done;
  ASSERT_OK(p.publisher->ReceiveExpect(wire::FrameType::kRingBucketDone, &done, deadline));
  EXPECT_EQ(done.step, 7);
  EXPECT_EQ(done.bucket, 5u);
  EXPECT_EQ(done.slot, 1u);
}

}  // namespace
}  // namespace weightsync::transport::link
