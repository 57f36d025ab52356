// The members_report frame (wire/members_report.h): what a relay tells its parent of its subtree.
// Its decoder refuses anything that is not a bounded, printable, depth-first tree.
#include "wire/members_report.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "testing/test_util.h"
#include "wire/frame.h"

namespace weightsync::wire {
namespace {

::testing::AssertionResult IsProtocolError(const Status& s,
                                           std::initializer_list<std::string_view> parts = {}) {
  return testing::IsError(s, StatusCode::kProtocolError, parts);
}

std::vector<uint8_t> EncodeOf(const MembersReport& m) {
  std::vector<uint8_t> out;
  Encode(m, &out);
  return out;
}

ReportedMember At(uint32_t depth, std::string via, std::string peer = "10.0.0.7:51234") {
  ReportedMember e;
  e.peer = std::move(peer);
  e.via = std::move(via);
  e.depth = depth;
  e.held_step = 4;
  e.sent_step = 5;
  return e;
}

// relay a (depth 1) serving b (depth 2, a relay) serving c (depth 3); then leaf d at depth 1.
MembersReport Tree() {
  MembersReport m;
  m.held_step = 5;
  m.below = 4;
  m.room = 1;
  m.members = {At(1, ""), At(2, "tcp://a:1"), At(3, "tcp://b:1", "subscriber connection 3"),
               At(1, "")};
  m.members[0].serves = "tcp://a:1";
  m.members[1].serves = "tcp://b:1";
  m.members[1].locality = "rack-2";
  m.members[1].below = 1;
  m.members[0].below = 2;
  m.members[2].receiving_step = 6;
  m.members[1].room = 3;
  m.members[2].room = 0;
  return m;
}

TEST(WireMembersReport, RoundTripsEveryFieldAndRefusesEveryPrefixAndTrailingBytes) {
  const MembersReport m = Tree();
  const std::vector<uint8_t> bytes = EncodeOf(m);
  MembersReport out;
  out.members.resize(9);  // a used object keeps nothing of before
  ASSERT_OK(Decode(bytes, &out));
  EXPECT_EQ(out.held_step, 5);
  EXPECT_EQ(out.below, 4u);
  EXPECT_EQ(out.room, 1u);
  EXPECT_EQ(out.members, m.members);
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(len));
    EXPECT_TRUE(IsProtocolError(Decode(prefix, &out))) << len;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_TRUE(IsProtocolError(Decode(longer, &out)));
}

TEST(WireMembersReport, RefusesWhatIsNotADepthFirstTree) {
  MembersReport out;
  MembersReport m = Tree();
  m.members[0].depth = 0;
  m.members[0].via = "tcp://x:1";
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"at depth 0 after one at depth 0"}));
  m = Tree();
  m.members[0].depth = 2;  // the first entry is the reporter's own child
  m.members[0].via = "tcp://x:1";
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"at depth 2", "expected 1..1"}));
  m = Tree();
  m.members[2].depth = 4;  // a grandchild's child with no grandchild before it
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"at depth 4 after one at depth 2"}));
  m = Tree();
  m.members[1].via = "";  // below depth 1, the relay that serves it is named
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"names no relay that serves it"}));
  m = Tree();
  m.members[3].via = "tcp://a:1";  // the reporter's own child names nobody
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"names a relay though the reporter"}));
  // No deeper than kMaxTreeDepth.
  m = MembersReport{};
  for (uint32_t d = 1; d <= kMaxTreeDepth; ++d) m.members.push_back(At(d, d == 1 ? "" : "l://r"));
  ASSERT_OK(Decode(EncodeOf(m), &out));
  m.members.push_back(At(kMaxTreeDepth + 1, "l://r"));
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"at depth 65", "expected 1..64"}));
}

TEST(WireMembersReport, TextsAreBoundedPrintableAndStepsAtLeastMinusOne) {
  MembersReport out;
  MembersReport m = Tree();
  m.members[2].peer = std::string(kMaxPeerBytes, 'p');
  ASSERT_OK(Decode(EncodeOf(m), &out));
  m.members[2].peer.push_back('p');
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"peer length 129 exceeds limit 128"}));
  m = Tree();
  m.members[2].peer = "conn\x1b[2J";
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"peer byte 4 is 27"}));
  m = Tree();
  m.members[2].peer = "";
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"peer is empty"}));
  m = Tree();
  m.members[1].serves = "tcp://b 1";  // endpoints hold no spaces, peers may
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"serves byte 7 is 32"}));
  m = Tree();
  m.members[1].locality = std::string(kMaxLocalityBytes + 1, 'l');
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"locality"}));
  m = Tree();
  m.members[2].via = std::string(kMaxEndpointBytes + 1, 'v');
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"via"}));
  m = Tree();
  m.members[1].sent_step = -2;
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"sent_step -2"}));
  m = Tree();
  m.held_step = -7;
  EXPECT_TRUE(IsProtocolError(Decode(EncodeOf(m), &out), {"held_step -7"}));
}

TEST(WireMembersReport, IsFrameType19AndItsLargestFitsItsCap) {
  EXPECT_EQ(static_cast<uint16_t>(FrameType::kMembersReport), 19);
  EXPECT_EQ(FrameTypeName(FrameType::kMembersReport), "members_report");
  EXPECT_EQ(MaxPayloadOf(FrameType::kMembersReport), kMaxMembersReportBytes);
}

TEST(WireMembersReport, CountIsBoundedAndTheLargestFitsItsFrame) {
  MembersReport m;
  ReportedMember big = At(1, "");
  big.peer = std::string(kMaxPeerBytes, 'p');
  big.serves = std::string(kMaxEndpointBytes, 's');
  big.locality = std::string(kMaxLocalityBytes, 'l');
  m.members.push_back(big);
  EXPECT_EQ(EncodeOf(m).size(), 20u + kMaxReportedMemberBytes - kMaxEndpointBytes);
  // A count the payload cannot hold, or past the bound, is refused before anything is reserved.
  std::vector<uint8_t> bytes = EncodeOf(MembersReport{});
  bytes[16] = 0xff;
  bytes[17] = 0xff;
  bytes[18] = 0xff;
  bytes[19] = 0x7f;
  MembersReport out;
  EXPECT_TRUE(IsProtocolError(Decode(bytes, &out), {"members"}));
  EXPECT_LE(kMaxMembersReportBytes, kMaxPayloadBytes);
}

}  // namespace
}  // namespace weightsync::wire
