// What the publishers publish, as the subscriber lists it (plan/published_manifest.h): tied
// weights read off the placements and named as aliases, the union of several publishers each name
// once, shards standing for their global tensor; and Manifest's own rules for aliases.
#include "plan/published_manifest.h"

#include <gtest/gtest.h>

#include "plan/plan.h"
#include "testing/test_util.h"

namespace weightsync::plan {
namespace {

wire::TensorPlacement Placed(const std::string& name, std::vector<int64_t> shape, uint64_t offset,
                             DType dtype = DType::kFloat32) {
  wire::TensorPlacement p;
  p.spec = {name, dtype, shape, 0};
  p.spec.nbytes = *TensorView{nullptr, dtype, shape}.NumBytes();
  p.offset = offset;
  return p;
}

// A slot layout of `tensors` (offsets as given), valid for ValidateLayout.
wire::Welcome Layout(std::vector<wire::TensorPlacement> tensors) {
  wire::Welcome w;
  w.segment_bytes = 64;
  w.slot_count = 1;
  w.slot_bytes = 1 << 16;
  w.arena_bytes = w.slot_bytes;
  w.tensors = std::move(tensors);
  EXPECT_OK(ValidateLayout(w));
  return w;
}

TEST(PublishedAliases, ATensorPlacedAtAnEarlierOnesBytesWithItsDtypeAndShapeIsItsAlias) {
  const wire::Welcome w = Layout({Placed("embed", {4, 8}, 0), Placed("norm", {8}, 128),
                                  Placed("lm_head", {4, 8}, 0),  // tied to embed
                                  Placed("view", {32}, 0),       // same bytes, other shape
                                  Placed("half", {4, 8}, 0, DType::kInt32),  // other dtype
                                  Placed("empty", {0}, 0), Placed("empty2", {0}, 0)});
  EXPECT_EQ(PublishedAliases(w), (std::vector<int64_t>{-1, -1, 0, -1, -1, -1, -1}));
}

TEST(PublishedAliases, ShardsAreNeverAliases) {
  wire::Welcome w = Layout({Placed("a", {4}, 0), Placed("b", {4}, 0)});
  w.tensors[1].sharded = true;
  w.tensors[1].shard = {"g", {8}, {4}};
  EXPECT_EQ(PublishedAliases(w), (std::vector<int64_t>{-1, -1}));
}

TEST(PublishedManifest, NamesTiedWeightsAsAliasesOfTheirOriginal) {
  PublishedManifest m;
  ASSERT_OK(m.Add(Layout({Placed("embed", {4, 8}, 0), Placed("lm_head", {4, 8}, 0)}), "p0"));
  ASSERT_OK_AND_ASSIGN(Manifest out, std::move(m).Finish());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out.tensors()[0].alias_of, "");
  EXPECT_EQ(out.tensors()[1].alias_of, "embed");
}

TEST(PublishedManifest, SeveralPublishersListEachNameOnceAndMustAgree) {
  PublishedManifest m;
  ASSERT_OK(m.Add(Layout({Placed("a", {4}, 0), Placed("b", {2}, 64)}), "p0"));
  ASSERT_OK(
      m.Add(Layout({Placed("b", {2}, 0), Placed("c", {3}, 64), Placed("c_tied", {3}, 64)}), "p1"));
  EXPECT_STATUS_IS(kInvalidArgument, m.Add(Layout({Placed("c", {4}, 0)}), "p2"),
                   "tensor 'c': p1 publishes float32 [3], p2 publishes float32 [4]");
  ASSERT_OK_AND_ASSIGN(Manifest out, std::move(m).Finish());
  std::vector<std::string> names;
  for (const TensorSpec& s : out.tensors()) names.push_back(s.name + ":" + s.alias_of);
  EXPECT_EQ(names, (std::vector<std::string>{"a:", "b:", "c:", "c_tied:c"}));
}

TEST(PublishedManifest, ShardsStandForTheirGlobalTensor) {
  wire::Welcome w = Layout({Placed("w.0", {2, 4}, 0), Placed("w.1", {2, 4}, 64)});
  for (int r = 0; r < 2; ++r) {
    w.tensors[r].sharded = true;
    w.tensors[r].shard = {"w", {4, 4}, {2 * r, 0}};
  }
  PublishedManifest m;
  ASSERT_OK(m.Add(w, "p0"));
  ASSERT_OK_AND_ASSIGN(Manifest out, std::move(m).Finish());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out.tensors()[0].name, "w");
  EXPECT_EQ(out.tensors()[0].shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(out.tensors()[0].nbytes, 64u);
}

TEST(ManifestAliases, AnAliasNamesAnEarlierOriginalOfItsDtypeAndShape) {
  ASSERT_OK(Manifest::Build({{"a", DType::kFloat32, {4}, 0}, {"b", DType::kFloat32, {4}, 0, "a"}}));
  EXPECT_STATUS_IS(kInvalidArgument,
                   Manifest::Build({{"a", DType::kFloat32, {4}, 0},
                                    {"b", DType::kFloat32, {4}, 0, "nope"},
                                    {"c", DType::kFloat16, {4}, 0, "a"},
                                    {"d", DType::kFloat32, {4}, 0, "b"},
                                    {"e", DType::kFloat32, {4}, 0, "e"}}),
                   "4 problem(s)", "tensor 1 'b': an alias of 'nope', which is no earlier tensor",
                   "tensor 2 'c': an alias of 'a' (float32 [4]) must have its dtype and shape, "
                   "not float16 [4]",
                   "tensor 3 'd': an alias of 'b', itself an alias of 'nope' (name the original)",
                   "tensor 4 'e': an alias of 'e', which is no earlier tensor");
  // Appended later, an alias may name a tensor of an earlier Append.
  ASSERT_OK_AND_ASSIGN(Manifest m, Manifest::Build({{"a", DType::kUInt8, {2}, 0}}));
  ASSERT_OK(m.Append({{"a2", DType::kUInt8, {2}, 0, "a"}}));
  EXPECT_EQ(m.tensors()[1].alias_of, "a");
}

}  // namespace
}  // namespace weightsync::plan
