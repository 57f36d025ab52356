// The subscriber's half of a tcp step sent as deltas (transport/path/delta_receiver.h), against a
// hand-played publisher on a socket pair: what lands for good deltas and whole segments, and each
// check's error for a publisher that sends something else — with the destinations untouched.
#include "transport/path/delta_receiver.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <random>

#include "delta/segment_delta.h"
#include "testing/status_matchers.h"

namespace weightsync::transport::path {
namespace {

using util::Deadline;

constexpr uint64_t kSegmentBytes = 4096;
constexpr int64_t kBase = 4;
constexpr int64_t kStep = 5;

TensorSpec Spec(const std::string& name, DType dtype, int64_t elements, uint64_t element_bytes) {
  TensorSpec s;
  s.name = name;
  s.dtype = dtype;
  s.shape = {elements};
  s.nbytes = static_cast<uint64_t>(elements) * element_bytes;
  return s;
}

// Two tensors over three digest segments: a bf16 one of exactly one segment and a byte tensor of
// one and a bit. Received in place, so what lands is the destinations.
class DeltaReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<TensorSpec> specs = {Spec("w", DType::kBFloat16, 2048, 2),
                                           Spec("idx", DType::kUInt8, 5000, 1)};
    uint64_t at = 0;
    for (const TensorSpec& s : specs) {
      wire::TensorPlacement p;
      p.spec = s;
      p.region = wire::Region::kSlot;
      p.offset = at;
      at += s.nbytes;
      welcome_.tensors.push_back(p);
    }
    welcome_.segment_bytes = kSegmentBytes;
    welcome_.slots_offset = 0;
    welcome_.slot_bytes = at;
    welcome_.slot_count = 2;
    welcome_.arena_bytes = 2 * at;
    std::mt19937 rng(7);
    for (const TensorSpec& s : specs) {
      base_.emplace_back(s.nbytes);
      for (auto& b : base_.back()) b = static_cast<uint8_t>(rng());
      next_.push_back(base_.back());
      // About 2% of the elements change.
      for (size_t i = 0; i < next_.back().size(); i += 50) next_.back()[i] ^= 0x5A;
    }
    dst_ = base_;
    std::vector<plan::Destination> destinations;
    for (size_t i = 0; i < specs.size(); ++i) {
      destinations.push_back({specs[i], dst_[i].data(), Device{}});
    }
    ASSERT_OK_AND_ASSIGN(plan_,
                         plan::BuildPlan(welcome_, destinations, MatchPolicy::kStrict, 4ull << 20));
    ASSERT_EQ(plan_.segments.size(), 3u);
    ASSERT_OK(landing_.Prepare(&plan_, destinations, UpdateMode::kInPlace, 2));
    // The committed version's digests, as its StepEnd brought them.
    base_digests_.assign(plan_.digest_count, 0);
    for (const plan::Segment& s : plan_.segments) {
      base_digests_[s.digest_index] =
          HostDigest(wire::DigestKind::kXxh3, SegmentOf(base_, s), s.bytes);
    }
    receiver_.Prepare(&plan_, &welcome_, &landing_);
    receiver_.Expect(kBase, base_digests_);
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    publisher_ = std::make_unique<link::Channel>(util::UniqueFd(fds[0]), "subscriber");
    subscriber_ = std::make_unique<link::Channel>(util::UniqueFd(fds[1]), "publisher");
  }
  void TearDown() override {
    EXPECT_OK(receiver_.Release());
    EXPECT_OK(landing_.Release());
  }

  // Segment s's bytes within `tensors` (one vector per planned tensor, in plan order).
  const uint8_t* SegmentOf(const std::vector<std::vector<uint8_t>>& tensors,
                           const plan::Segment& s) const {
    return tensors[s.destination].data() + s.dst_offset;
  }
  uint32_t ElementBytes(const plan::Segment& s) const { return s.destination == 0 ? 2 : 1; }
  // The delta of segment `i` from base_ to next_.
  std::vector<uint8_t> DeltaOfSegment(size_t i) {
    const plan::Segment& s = plan_.segments[i];
    std::vector<uint8_t> out(delta::MaxDeltaBytes(s.bytes, ElementBytes(s)));
    delta::SegmentEncoder encoder;
    auto encoded = encoder.Encode({SegmentOf(base_, s), s.bytes}, {SegmentOf(next_, s), s.bytes},
                                  ElementBytes(s), out);
    EXPECT_TRUE(encoded.has_value());
    out.resize(encoded ? encoded->bytes : 0);
    return out;
  }
  // What a publisher that encoded against the committed version claims about it.
  wire::DeltaBegin Begin(std::vector<uint64_t> bytes) {
    std::vector<uint64_t> ordered;
    for (const plan::Segment& s : plan_.segments) ordered.push_back(base_digests_[s.digest_index]);
    return wire::DeltaBegin{kStep, kBase, wire::DigestOfDigests(ordered), std::move(bytes)};
  }
  // Sends `begin` then `payload` (segment by segment, as laid out by begin), and receives.
  Status Play(const wire::DeltaBegin& begin, const std::vector<std::vector<uint8_t>>& payload) {
    const Deadline deadline(std::chrono::milliseconds(2000));
    WS_RETURN_IF_ERROR(publisher_->Send(wire::FrameType::kDeltaBegin, begin, deadline));
    std::vector<iovec> parts;
    for (const auto& p : payload) {
      parts.push_back({const_cast<uint8_t*>(p.data()), p.size()});
    }
    if (!parts.empty()) WS_RETURN_IF_ERROR(publisher_->WriteAll(parts, deadline));
    return receiver_.Receive(*subscriber_, "publisher tcp://h:1", kStep, deadline);
  }
  std::vector<uint8_t> WholeSegment(size_t i) {
    const plan::Segment& s = plan_.segments[i];
    return {SegmentOf(next_, s), SegmentOf(next_, s) + s.bytes};
  }

  wire::Welcome welcome_;
  std::vector<std::vector<uint8_t>> base_, next_, dst_;
  plan::Plan plan_;
  HostLanding landing_;
  std::vector<uint64_t> base_digests_;
  DeltaReceiver receiver_;
  std::unique_ptr<link::Channel> publisher_, subscriber_;
};

TEST_F(DeltaReceiverTest, DeltasAndWholeSegmentsLandAsTheNewVersion) {
  const std::vector<uint8_t> d0 = DeltaOfSegment(0), d2 = DeltaOfSegment(2);
  ASSERT_LT(d0.size(), kSegmentBytes / 4);
  ASSERT_OK(Play(Begin({d0.size(), 0, d2.size()}), {d0, WholeSegment(1), d2}));
  EXPECT_EQ(dst_, next_);
  EXPECT_EQ(receiver_.receipt().base_step, kBase);
  EXPECT_EQ(receiver_.receipt().delta_segments, 2u);
  EXPECT_EQ(receiver_.receipt().received_bytes, d0.size() + kSegmentBytes + d2.size());
  EXPECT_GE(receiver_.buffer_bytes(), d0.size() + d2.size());
}

TEST_F(DeltaReceiverTest, NoDeltaThisStepMeansEverySegmentWhole) {
  ASSERT_OK(Play(wire::DeltaBegin{kStep, -1, 0, {}},
                 {WholeSegment(0), WholeSegment(1), WholeSegment(2)}));
  EXPECT_EQ(dst_, next_);
  EXPECT_EQ(receiver_.receipt().base_step, -1);
  EXPECT_EQ(receiver_.receipt().delta_segments, 0u);
  EXPECT_EQ(receiver_.receipt().received_bytes, plan_.total_bytes);
}

TEST_F(DeltaReceiverTest, ADeltaBeginOfAnotherStepIsRefused) {
  wire::DeltaBegin begin = Begin({0, 0, 0});
  begin.step = kStep + 1;
  EXPECT_STATUS_IS(kProtocolError, Play(begin, {}), "delta_begin for step 6 in step 5");
  EXPECT_EQ(dst_, base_);
}

TEST_F(DeltaReceiverTest, DeltasAgainstAnotherStepThanTheCommittedOneAreRefused) {
  wire::DeltaBegin begin = Begin({0, 0, 0});
  begin.base_step = kBase - 1;
  EXPECT_STATUS_IS(kProtocolError, Play(begin, {}),
                   "as deltas against step 3, but the committed step is 4");
  EXPECT_EQ(dst_, base_);
}

TEST_F(DeltaReceiverTest, SizesForAnotherNumberOfSegmentsAreRefused) {
  EXPECT_STATUS_IS(kProtocolError, Play(Begin({0, 0}), {}),
                   "delta_begin sizes 2 segments, the selection has 3");
  EXPECT_EQ(dst_, base_);
}

TEST_F(DeltaReceiverTest, ADeltaLargerThanItsSegmentCouldNeedIsRefusedBeforeAnyRead) {
  const uint64_t most = delta::MaxDeltaBytes(kSegmentBytes, 2);
  EXPECT_STATUS_IS(kProtocolError, Play(Begin({most + 1, 0, 0}), {}),
                   "segment 0 delta of " + std::to_string(most + 1) + " bytes, more than");
  EXPECT_EQ(dst_, base_);
  EXPECT_EQ(receiver_.buffer_bytes(), 0u);  // nothing allocated for it
}

TEST_F(DeltaReceiverTest, DeltasAgainstAnotherBaseAreRefusedWithNothingApplied) {
  wire::DeltaBegin begin = Begin({1, 1, 1});
  begin.base_digest ^= 1;
  EXPECT_STATUS_IS(kCorruption, Play(begin, {}), "not applied");
  EXPECT_EQ(dst_, base_);
}

TEST_F(DeltaReceiverTest, AMalformedDeltaAppliesNoneOfTheStepsDeltas) {
  const std::vector<uint8_t> d0 = DeltaOfSegment(0), d1 = DeltaOfSegment(1);
  std::vector<uint8_t> d2 = DeltaOfSegment(2);
  d2[0] = 0x80;  // a directory code no chunk has
  EXPECT_STATUS_IS(kProtocolError, Play(Begin({d0.size(), d1.size(), d2.size()}), {d0, d1, d2}),
                   "segment 2 delta from publisher tcp://h:1: nothing applied");
  EXPECT_EQ(dst_, base_);
}

}  // namespace
}  // namespace weightsync::transport::path
