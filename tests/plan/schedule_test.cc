// Tests for the static schedule across several publishers: each registered tensor gets exactly one
// source, shared tensors are balanced deterministically, and every problem is listed at once.

#include "plan/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace weightsync::plan {
namespace {

TensorSpec Bytes(const std::string& name, int64_t n, DType dtype = DType::kUInt8) {
  TensorSpec s;
  s.name = name;
  s.dtype = dtype;
  s.shape = {n};
  s.nbytes = static_cast<uint64_t>(n) * (dtype == DType::kFloat32 ? 4 : 1);
  return s;
}

wire::Welcome Publishes(const std::vector<TensorSpec>& specs) {
  wire::Welcome w;
  for (const TensorSpec& s : specs) w.tensors.push_back({s, wire::Region::kSlot, 0});
  return w;
}

std::vector<Destination> Registers(const std::vector<TensorSpec>& specs) {
  std::vector<Destination> out;
  for (const TensorSpec& s : specs) out.push_back({s, nullptr, Device{}});
  return out;
}

TEST(AssignSources, DisjointHalvesGoToTheirOwners) {
  wire::Welcome a = Publishes({Bytes("l0", 100), Bytes("l1", 200)});
  wire::Welcome b = Publishes({Bytes("l2", 300), Bytes("l3", 400)});
  auto dst = Registers({Bytes("l0", 100), Bytes("l1", 200), Bytes("l2", 300), Bytes("l3", 400)});
  auto s = AssignSources({{"A", &a}, {"B", &b}}, dst, MatchPolicy::kStrict);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->destinations[0], (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(s->destinations[1], (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(s->bytes, (std::vector<uint64_t>{300, 700}));
}

TEST(AssignSources, ReplicatedTensorsBalanceTheLoadLargestFirst) {
  // Both publish everything: 500, 400, 300, 200 → A gets 500 and 200, B gets 400 and 300.
  std::vector<TensorSpec> all = {Bytes("w200", 200), Bytes("w500", 500), Bytes("w300", 300),
                                 Bytes("w400", 400)};
  wire::Welcome a = Publishes(all), b = Publishes(all);
  auto s = AssignSources({{"A", &a}, {"B", &b}}, Registers(all), MatchPolicy::kStrict);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->destinations[0], (std::vector<uint32_t>{0, 1}));  // w200, w500
  EXPECT_EQ(s->destinations[1], (std::vector<uint32_t>{2, 3}));  // w300, w400
  EXPECT_EQ(s->bytes, (std::vector<uint64_t>{700, 700}));
}

TEST(AssignSources, OwnedTensorsCountBeforeSharedOnesAreBalanced) {
  // A alone holds a big tensor, so the shared ones go to B.
  wire::Welcome a = Publishes({Bytes("big", 1000), Bytes("n1", 10), Bytes("n2", 10)});
  wire::Welcome b = Publishes({Bytes("n1", 10), Bytes("n2", 10)});
  auto s = AssignSources({{"A", &a}, {"B", &b}},
                         Registers({Bytes("big", 1000), Bytes("n1", 10), Bytes("n2", 10)}),
                         MatchPolicy::kStrict);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->destinations[0], (std::vector<uint32_t>{0}));
  EXPECT_EQ(s->destinations[1], (std::vector<uint32_t>{1, 2}));
}

TEST(AssignSources, APublisherMayDeliverNothing) {
  wire::Welcome a = Publishes({Bytes("x", 8)});
  wire::Welcome b = Publishes({Bytes("y", 8)});
  auto s = AssignSources({{"A", &a}, {"B", &b}}, Registers({Bytes("y", 8)}), MatchPolicy::kSubset);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->destinations[0].empty());
  EXPECT_EQ(s->destinations[1], (std::vector<uint32_t>{0}));
}

TEST(AssignSources, EveryProblemIsListedWithThePublisherThatHasIt) {
  wire::Welcome a = Publishes({Bytes("ok", 8), Bytes("extra_a", 8), Bytes("wide", 8)});
  wire::Welcome b = Publishes({Bytes("typed", 8, DType::kFloat32)});
  auto dst = Registers({Bytes("ok", 8), Bytes("wide", 16), Bytes("typed", 8), Bytes("nowhere", 4)});
  auto s = AssignSources({{"local://a", &a}, {"local://b", &b}}, dst, MatchPolicy::kStrict);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  const std::string m = s.status().message();
  EXPECT_NE(m.find("4 mismatches"), std::string::npos) << m;
  EXPECT_NE(m.find("'extra_a': published by local://a but not registered"), std::string::npos) << m;
  EXPECT_NE(m.find("'wide': shape mismatch: publisher local://a [8], subscriber [16]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("'typed': dtype mismatch: publisher local://b float32, subscriber uint8"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("'nowhere': registered by subscriber but published by none of local://a, "
                   "local://b"),
            std::string::npos)
      << m;
}

TEST(AssignSources, AReplicaNeedingNoConversionWinsAndScalesFollowTheirTensor) {
  const ConvertOptions on{true, "_scale_inv"};
  TensorSpec w_bf16 = Bytes("w", 256, DType::kUInt8);
  w_bf16.dtype = DType::kBFloat16;
  w_bf16.shape = {2, 128};
  w_bf16.nbytes = 512;
  TensorSpec w_fp8 = w_bf16;
  w_fp8.dtype = DType::kFloat8E4M3FN;
  w_fp8.nbytes = 256;
  TensorSpec scale = Bytes("w_scale_inv", 1, DType::kFloat32);
  scale.shape = {1, 1};
  // A publishes bf16 (would convert); B publishes the fp8 weight and its scales as they are.
  wire::Welcome a = Publishes({w_bf16, Bytes("a_only", 64)});
  wire::Welcome b = Publishes({w_fp8, scale});
  auto dst = Registers({w_fp8, scale, Bytes("a_only", 64)});
  auto s = AssignSources({{"A", &a}, {"B", &b}}, dst, MatchPolicy::kStrict, on);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->destinations[0], (std::vector<uint32_t>{2}));
  EXPECT_EQ(s->destinations[1], (std::vector<uint32_t>{0, 1}));
  // Only bf16 publishers: the weight goes to one of them and its (unpublished) scales with it.
  wire::Welcome c = Publishes({w_bf16});
  wire::Welcome d = Publishes({w_bf16, Bytes("big", 4096)});
  auto dst2 = Registers({w_fp8, scale, Bytes("big", 4096)});
  auto s2 = AssignSources({{"C", &c}, {"D", &d}}, dst2, MatchPolicy::kSubset, on);
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_EQ(s2->destinations[0], (std::vector<uint32_t>{0, 1}));  // D is loaded with "big"
  EXPECT_EQ(s2->bytes[0], 512u) << "balance counts the published bf16 bytes";
}

TEST(AssignSources, SubsetPolicyAllowsPublisherExtras) {
  wire::Welcome a = Publishes({Bytes("x", 8), Bytes("unused", 8)});
  auto s = AssignSources({{"A", &a}}, Registers({Bytes("x", 8)}), MatchPolicy::kSubset);
  ASSERT_TRUE(s.ok()) << s.status();
  auto strict = AssignSources({{"A", &a}}, Registers({Bytes("x", 8)}), MatchPolicy::kStrict);
  EXPECT_FALSE(strict.ok());
}

// Random manifests: whenever a schedule is returned, every destination is delivered by exactly
// one source that publishes it, and the byte totals add up.
TEST(AssignSources, EveryDestinationHasExactlyOneSourceThatHoldsIt) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int sources = 1 + static_cast<int>(rng() % 4);
    const int tensors = 1 + static_cast<int>(rng() % 30);
    std::vector<TensorSpec> all;
    for (int t = 0; t < tensors; ++t)
      all.push_back(Bytes("t" + std::to_string(t), 1 + rng() % 999));
    std::vector<wire::Welcome> welcomes(sources);
    for (int t = 0; t < tensors; ++t) {
      welcomes[rng() % sources].tensors.push_back({all[t], wire::Region::kSlot, 0});
      for (int s = 0; s < sources; ++s) {  // sometimes replicated
        if (rng() % 4 == 0) welcomes[s].tensors.push_back({all[t], wire::Region::kSlot, 0});
      }
    }
    for (auto& w : welcomes) {  // a replica may have landed twice on one source; keep one
      std::vector<wire::TensorPlacement> unique;
      for (auto& p : w.tensors) {
        if (std::none_of(unique.begin(), unique.end(),
                         [&](auto& u) { return u.spec.name == p.spec.name; })) {
          unique.push_back(p);
        }
      }
      w.tensors = unique;
    }
    std::vector<SourceManifest> manifests;
    for (int s = 0; s < sources; ++s) manifests.push_back({"s" + std::to_string(s), &welcomes[s]});
    auto dst = Registers(all);
    auto sched = AssignSources(manifests, dst, MatchPolicy::kStrict);
    ASSERT_TRUE(sched.ok()) << sched.status();
    std::vector<int> delivered(tensors, 0);
    uint64_t total = 0, expected = 0;
    for (int s = 0; s < sources; ++s) {
      uint64_t bytes = 0;
      for (uint32_t d : sched->destinations[s]) {
        ++delivered[d];
        bytes += dst[d].spec.nbytes;
        bool holds = std::any_of(welcomes[s].tensors.begin(), welcomes[s].tensors.end(),
                                 [&](auto& p) { return p.spec.name == dst[d].spec.name; });
        EXPECT_TRUE(holds) << "source " << s << " assigned " << dst[d].spec.name;
      }
      EXPECT_EQ(bytes, sched->bytes[s]);
      total += bytes;
    }
    for (auto& d : dst) expected += d.spec.nbytes;
    EXPECT_EQ(total, expected);
    for (int t = 0; t < tensors; ++t) EXPECT_EQ(delivered[t], 1) << "tensor " << t;
  }
}

TEST(AssignSources, ABlockScaledDestinationFromSeveralPublishersIsRefusedByName) {
  wire::Welcome a = Publishes({Bytes("l0", 100)});
  wire::Welcome b = Publishes({Bytes("l1", 100)});
  auto dst = Registers({Bytes("l0", 100), Bytes("l1", 100)});
  dst[1].quantization.format = Quantization::Format::kNvfp4;
  auto s = AssignSources({{"A", &a}, {"B", &b}}, dst, MatchPolicy::kStrict);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'l1': block-scaled quantization (MXFP8, NVFP4) from several "
                                      "publishers is not supported yet"),
            std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace weightsync::plan
