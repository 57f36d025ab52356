// DestinationSet: what a Subscriber may register. Destinations never share a byte except as exact
// aliases (tied weights), which are marked so a step writes them once; names are replaceable and
// removable; every change is all-or-nothing; adding names one at a time stays linear.
#include "core/destination_set.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::core {
namespace {

NamedTensor At(const std::string& name, void* data, std::vector<int64_t> shape,
               DType dtype = DType::kFloat32) {
  return {name, TensorView{data, dtype, std::move(shape)}};
}

std::vector<std::string> Names(const DestinationSet& set) {
  std::vector<std::string> out;
  for (const auto& d : set.destinations()) out.push_back(d.spec.name);
  return out;
}

TEST(DestinationSet, OverlappingDestinationsAreRefusedNamingBoth) {
  std::vector<float> memory(64);
  DestinationSet set;
  ASSERT_OK(set.Add({At("a", memory.data(), {16})}));
  // Starts inside "a", ends inside "a", contains "a": each refused, naming both tensors.
  for (auto [offset, count] : {std::pair{8, 4}, std::pair{0, 32}, std::pair{15, 2}}) {
    SCOPED_TRACE(offset);
    Status s = set.Add({At("b", memory.data() + offset, {count})});
    ASSERT_STATUS_IS(kInvalidArgument, s, "tensor 'b' overlaps tensor 'a' in cpu memory");
  }
  // A range that ends where "a" starts, and one after it, are fine.
  ASSERT_OK(set.Add({At("c", memory.data() + 16, {8}), At("d", memory.data() + 40, {8})}));
  Status s = set.Add({At("e", memory.data() + 20, {4})});  // inside "c", registered later
  ASSERT_STATUS_IS(kInvalidArgument, s, "'e' overlaps tensor 'c'");
  // Two new ones overlapping each other within one call.
  s = set.Add({At("f", memory.data() + 24, {8}), At("g", memory.data() + 28, {8})});
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Names(set), (std::vector<std::string>{"a", "c", "d"})) << "a refused call adds nothing";
}

TEST(DestinationSet, ExactAliasesAreTiedAndAnythingElseAtTheSameAddressIsRefused) {
  std::vector<uint16_t> memory(32);
  DestinationSet set;
  ASSERT_OK(set.Add({At("embed", memory.data(), {4, 8}, DType::kBFloat16),
                     At("lm_head", memory.data(), {4, 8}, DType::kBFloat16)}));
  ASSERT_EQ(set.destinations().size(), 2u);
  EXPECT_EQ(set.destinations()[0].alias_of, plan::kNoDestination);
  EXPECT_EQ(set.destinations()[1].alias_of, 0u);
  // Same address, other shape or dtype: not the same tensor, so an overlap.
  EXPECT_EQ(set.Add({At("x", memory.data(), {8, 4}, DType::kBFloat16)}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(set.Add({At("y", memory.data(), {4, 8}, DType::kFloat16)}).code(),
            StatusCode::kInvalidArgument);
  // Removing the original makes its alias the owner of the memory.
  ASSERT_OK(set.Remove({"embed"}));
  ASSERT_EQ(set.destinations().size(), 1u);
  EXPECT_EQ(set.destinations()[0].alias_of, plan::kNoDestination);
}

TEST(DestinationSet, ANameRegisteredAgainTakesTheNewMemoryInItsPlace) {
  std::vector<float> old_memory(16), new_memory(16);
  DestinationSet set;
  ASSERT_OK(set.Add({At("a", old_memory.data(), {8}), At("b", old_memory.data() + 8, {8})}));
  // Corrects a wrong shape, moves "a" to new memory; "b" keeps its place.
  ASSERT_OK(set.Add({At("a", new_memory.data(), {2, 8})}));
  EXPECT_EQ(Names(set), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(set.destinations()[0].data, reinterpret_cast<uint8_t*>(new_memory.data()));
  EXPECT_EQ(set.destinations()[0].spec.shape, (std::vector<int64_t>{2, 8}));
  // A replacement that would overlap is refused and changes nothing.
  Status s = set.Add({At("a", old_memory.data() + 4, {8})});
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(set.destinations()[0].data, reinterpret_cast<uint8_t*>(new_memory.data()));
}

TEST(DestinationSet, RemovingUnknownNamesRemovesNothingAndNamesThem) {
  std::vector<float> memory(16);
  DestinationSet set;
  ASSERT_OK(set.Add({At("a", memory.data(), {8}), At("b", memory.data() + 8, {8})}));
  Status s = set.Remove({"b", "nope", "zip"});
  ASSERT_STATUS_IS(kNotFound, s, "'nope', 'zip'");
  EXPECT_EQ(Names(set), (std::vector<std::string>{"a", "b"}));
  ASSERT_OK(set.Remove({"a"}));
  EXPECT_EQ(Names(set), (std::vector<std::string>{"b"}));
  // The freed range can be registered again.
  ASSERT_OK(set.Add({At("c", memory.data(), {8})}));
}

TEST(DestinationSet, AddingAHundredThousandTensorsOneAtATimeIsLinear) {
  // Quadratic (rebuilding the whole set per call) took minutes at this size; linear takes well
  // under a second. The bound is generous on purpose: it tells O(n) from O(n²), nothing finer.
  constexpr int kCount = 100000;
  std::vector<float> memory(kCount);
  DestinationSet set;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCount; ++i) {
    Status s = set.Add({At("layers." + std::to_string(i), memory.data() + i, {1})});
    ASSERT_TRUE(s.ok()) << i << ": " << s;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(set.destinations().size(), static_cast<size_t>(kCount));
  EXPECT_LT(seconds, testing::kUnderSanitizer ? 60.0 : 15.0);
}

}  // namespace
}  // namespace weightsync::core
