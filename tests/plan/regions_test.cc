// Region scheduling: sharded trainers into sharded engines, every destination byte exactly once.
// Layouts as the field has them (FSDP dim-0 shards into TP column and row shards, fused qkv with
// GQA, stacked experts EP-4 into EP-2), every problem listed in one error, and a property test over
// random layouts that executes the copies on host buffers and counts every byte's writes.
#include "plan/regions.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::plan {
namespace {

// The global tensors' bytes: element i of tensor t holds a pattern of (t, i).
uint32_t Value(int tensor, uint64_t element) {
  return static_cast<uint32_t>(tensor * 1000003u) ^ static_cast<uint32_t>(element * 2654435761u);
}

uint64_t Elements(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), uint64_t{1},
                         [](uint64_t a, int64_t b) { return a * static_cast<uint64_t>(b); });
}

// Row-major index of `at` in `shape`.
uint64_t Linear(const std::vector<int64_t>& at, const std::vector<int64_t>& shape) {
  uint64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * static_cast<uint64_t>(shape[d]) + at[d];
  return i;
}

// A world of global float32 tensors, what publishers hold of them (filled from the pattern) and
// destinations the copies write (counting every element's writes).
struct World {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<HeldTensor> held;
  std::vector<std::vector<uint32_t>> held_bytes;  // per held tensor
  std::vector<DestinationShape> destinations;
  std::vector<WantedPiece> wanted;

  int Global(const std::string& name, std::vector<int64_t> shape) {
    names.push_back(name);
    shapes.push_back(std::move(shape));
    return static_cast<int>(names.size()) - 1;
  }
  void Hold(uint32_t source, int tensor, const Box& box) {
    held.push_back({source, names[tensor], DType::kFloat32, shapes[tensor], box});
    std::vector<uint32_t> bytes(Elements(box.extent));
    std::vector<int64_t> at(box.offset.size(), 0);
    for (uint64_t i = 0; i < bytes.size(); ++i) {
      // `at`: index i inside the box, as global coordinates.
      uint64_t rest = i;
      for (size_t d = box.extent.size(); d-- > 0;) {
        at[d] = box.offset[d] + static_cast<int64_t>(rest % static_cast<uint64_t>(box.extent[d]));
        rest /= static_cast<uint64_t>(box.extent[d]);
      }
      bytes[i] = Value(tensor, Linear(at, shapes[tensor]));
    }
    held_bytes.push_back(std::move(bytes));
  }
  uint32_t Destination(const std::string& name, std::vector<int64_t> shape) {
    destinations.push_back({name, DType::kFloat32, std::move(shape)});
    return static_cast<uint32_t>(destinations.size()) - 1;
  }
  void Want(uint32_t destination, int tensor, const Box& box, std::vector<int64_t> at) {
    wanted.push_back({destination, names[tensor], shapes[tensor], box, std::move(at)});
  }
  int TensorOf(const std::string& name) const {
    return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
  }

  // Runs the copies; then every destination element must have been written once, with the value
  // its piece says (checked against the pattern).
  void Execute(const RegionSchedule& s, uint64_t* total_written) const {
    std::vector<std::vector<uint32_t>> out(destinations.size());
    std::vector<std::vector<int>> writes(destinations.size());
    for (size_t d = 0; d < destinations.size(); ++d) {
      out[d].assign(Elements(destinations[d].shape), 0xFFFFFFFFu);
      writes[d].assign(out[d].size(), 0);
    }
    uint64_t written = 0;
    for (const RegionCopy& c : s.copies) {
      const auto* src = reinterpret_cast<const uint8_t*>(held_bytes[c.held].data());
      auto* dst = reinterpret_cast<uint8_t*>(out[c.destination].data());
      ASSERT_EQ(c.run_bytes % 4, 0u);
      for (uint64_t r = 0; r < c.rows; ++r) {
        const uint64_t so = c.src_offset + r * c.src_pitch, dof = c.dst_offset + r * c.dst_pitch;
        ASSERT_LE(so + c.run_bytes, held_bytes[c.held].size() * 4) << "read past the held tensor";
        ASSERT_LE(dof + c.run_bytes, out[c.destination].size() * 4) << "write past the destination";
        std::memcpy(dst + dof, src + so, c.run_bytes);
        for (uint64_t e = 0; e < c.run_bytes / 4; ++e) ++writes[c.destination][dof / 4 + e];
        written += c.run_bytes;
      }
    }
    *total_written = written;
    for (const WantedPiece& p : wanted) {
      const int t = TensorOf(p.name);
      const auto& shape = destinations[p.destination].shape;
      std::vector<int64_t> g(p.box.offset.size()), at(shape.size());
      for (uint64_t i = 0; i < p.box.elements(); ++i) {
        uint64_t rest = i;
        for (size_t d = shape.size(); d-- > 0;) {
          const int64_t k = static_cast<int64_t>(rest % static_cast<uint64_t>(p.box.extent[d]));
          rest /= static_cast<uint64_t>(p.box.extent[d]);
          g[d] = p.box.offset[d] + k;
          at[d] = p.at[d] + k;
        }
        const uint64_t j = Linear(at, shape);
        ASSERT_EQ(out[p.destination][j], Value(t, Linear(g, shapes[t])))
            << destinations[p.destination].name << " element " << j << " from '" << p.name << "'";
      }
    }
    for (size_t d = 0; d < destinations.size(); ++d) {
      for (size_t j = 0; j < writes[d].size(); ++j) {
        ASSERT_EQ(writes[d][j], 1) << destinations[d].name << " element " << j;
      }
    }
  }
};

Box Whole(const std::vector<int64_t>& shape) {
  return {std::vector<int64_t>(shape.size(), 0), shape};
}

TEST(Regions, FsdpDimZeroShardsIntoTensorParallelColumnAndRowShards) {
  World w;
  const int col = w.Global("mlp.up.weight", {64, 32});    // column-parallel: split rows
  const int row = w.Global("mlp.down.weight", {32, 64});  // row-parallel: split columns
  for (uint32_t r = 0; r < 4; ++r) {                      // FSDP-4: dim-0 shards
    w.Hold(r, col, EvenShard({64, 32}, 0, 4, r));
    w.Hold(r, row, EvenShard({32, 64}, 0, 4, r));
  }
  // TP rank 1 of 2.
  const uint32_t up = w.Destination("up", {32, 32});
  const uint32_t down = w.Destination("down", {32, 32});
  w.Want(up, col, EvenShard({64, 32}, 0, 2, 1), {0, 0});
  w.Want(down, row, EvenShard({32, 64}, 1, 2, 1), {0, 0});
  ASSERT_OK_AND_ASSIGN(RegionSchedule s,
                       ScheduleRegions(w.held, w.destinations, w.wanted, /*sources=*/4));
  uint64_t written = 0;
  w.Execute(s, &written);
  EXPECT_EQ(written, 2u * 32 * 32 * 4) << "exactly the shard, nothing more";
  EXPECT_EQ(s.total_bytes, written);
  // Rows of a column-parallel shard are contiguous: one run per FSDP shard it overlaps.
  int up_copies = 0;
  for (const RegionCopy& c : s.copies) {
    if (c.destination == up) {
      ++up_copies;
      EXPECT_EQ(c.rows, 1u);
    } else {
      EXPECT_GT(c.rows, 1u) << "a row-parallel shard is one run per row";
    }
  }
  EXPECT_EQ(up_copies, 2);
  // Each publisher's 8 rows of down carry 32 wanted columns (1 KiB); publishers 2 and 3 also
  // hold up's rows [32, 64) (2 KiB each). Nobody else holds those bytes: the split is forced.
  EXPECT_EQ(s.bytes_per_source, (std::vector<uint64_t>{1024, 1024, 3072, 3072}));
}

TEST(Regions, FusedQkvWithGroupedQueryAttention) {
  // Qwen2.5-7B-like attention at 1/16 scale: 28 query heads, 4 kv heads, head_dim 8.
  World w;
  const int64_t hidden = 224, q_rows = 224, kv_rows = 32;
  const int q = w.Global("attn.q.weight", {q_rows, hidden});
  const int k = w.Global("attn.k.weight", {kv_rows, hidden});
  const int v = w.Global("attn.v.weight", {kv_rows, hidden});
  for (uint32_t r = 0; r < 4; ++r) {
    for (int t : {q, k, v}) w.Hold(r, t, EvenShard(w.shapes[t], 0, 4, r));
  }
  // TP-2 rank 1: qkv_proj = q rows [112, 224) ++ k rows [16, 32) ++ v rows [16, 32).
  const uint32_t qkv = w.Destination("qkv_proj.weight", {112 + 16 + 16, hidden});
  for (const WantedPiece& p : Fused(qkv, 0,
                                    {{w.names[q], w.shapes[q], EvenShard(w.shapes[q], 0, 2, 1)},
                                     {w.names[k], w.shapes[k], EvenShard(w.shapes[k], 0, 2, 1)},
                                     {w.names[v], w.shapes[v], EvenShard(w.shapes[v], 0, 2, 1)}})) {
    w.wanted.push_back(p);
  }
  ASSERT_OK_AND_ASSIGN(RegionSchedule s, ScheduleRegions(w.held, w.destinations, w.wanted, 4));
  uint64_t written = 0;
  w.Execute(s, &written);
  EXPECT_EQ(written, uint64_t{144} * hidden * 4);
}

TEST(Regions, StackedExpertsEp4IntoEp2) {
  World w;
  const int experts = w.Global("moe.experts.w1", {8, 16, 12});  // 8 experts stacked
  for (uint32_t r = 0; r < 4; ++r) w.Hold(r, experts, EvenShard({8, 16, 12}, 0, 4, r));
  const uint32_t mine = w.Destination("experts_0_3", {4, 16, 12});  // EP-2 rank 0
  w.Want(mine, experts, EvenShard({8, 16, 12}, 0, 2, 0), {0, 0, 0});
  ASSERT_OK_AND_ASSIGN(RegionSchedule s, ScheduleRegions(w.held, w.destinations, w.wanted, 4));
  uint64_t written = 0;
  w.Execute(s, &written);
  EXPECT_EQ(s.copies.size(), 2u);  // two whole EP-4 shards, each one contiguous run
  EXPECT_EQ(s.bytes_per_source, (std::vector<uint64_t>{2 * 16 * 12 * 4, 2 * 16 * 12 * 4, 0, 0}));
}

TEST(Regions, ReplicasGoToTheLeastLoadedHolderAndRotationSpreadsSubscribers) {
  World w;
  const int norm = w.Global("norm.weight", {1024});
  const int big = w.Global("big.weight", {4096});
  w.Hold(0, norm, Whole({1024}));
  w.Hold(1, norm, Whole({1024}));
  w.Hold(0, big, Whole({4096}));
  const uint32_t a = w.Destination("big", {4096});
  const uint32_t b = w.Destination("norm", {1024});
  w.Want(a, big, Whole({4096}), {0});
  w.Want(b, norm, Whole({1024}), {0});
  ASSERT_OK_AND_ASSIGN(RegionSchedule s, ScheduleRegions(w.held, w.destinations, w.wanted, 2));
  EXPECT_EQ(s.bytes_per_source, (std::vector<uint64_t>{4096 * 4, 1024 * 4}))
      << "the replica goes to the publisher with less to send";
  // Two subscribers wanting only the replicated tensor, planning on their own: rotation by rank.
  World r;
  const int t = r.Global("norm.weight", {1024});
  r.Hold(0, t, Whole({1024}));
  r.Hold(1, t, Whole({1024}));
  const uint32_t d = r.Destination("norm", {1024});
  r.Want(d, t, Whole({1024}), {0});
  ASSERT_OK_AND_ASSIGN(RegionSchedule s0, ScheduleRegions(r.held, r.destinations, r.wanted, 2, 0));
  ASSERT_OK_AND_ASSIGN(RegionSchedule s1, ScheduleRegions(r.held, r.destinations, r.wanted, 2, 1));
  EXPECT_EQ(s0.bytes_per_source, (std::vector<uint64_t>{4096, 0}));
  EXPECT_EQ(s1.bytes_per_source, (std::vector<uint64_t>{0, 4096}));
}

TEST(Regions, OneErrorListsEveryUncoveredAndDoublyClaimedRange) {
  World w;
  const int a = w.Global("a", {8, 4});
  const int b = w.Global("b", {8, 4});
  w.Hold(0, a, EvenShard({8, 4}, 0, 4, 0));  // rows [0, 2) only
  w.Hold(1, a, EvenShard({8, 4}, 0, 4, 3));  // rows [6, 8)
  w.Hold(0, b, Whole({8, 4}));
  const uint32_t da = w.Destination("dst_a", {8, 4});
  const uint32_t db = w.Destination("dst_b", {8, 4});
  w.Want(da, a, Whole({8, 4}), {0, 0});
  w.Want(db, b, Box{{0, 0}, {6, 4}}, {0, 0});
  w.Want(db, b, Box{{4, 0}, {4, 4}}, {4, 0});  // rows 4, 5 written twice
  auto s = ScheduleRegions(w.held, w.destinations, w.wanted, 2);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.status().message();
  EXPECT_NE(m.find("tensor 'a' [2:6, 0:4] (for destination 'dst_a'): held by no publisher"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("destination 'dst_b': pieces of 'b' and 'b' both write [4:6, 0:4]"),
            std::string::npos)
      << m;
}

// A destination whose pieces are all held but leave a hole (rows 4 and 5 of 8 wanted by nobody) is
// refused naming how much of it they write: its unwritten bytes would keep whatever they held.
TEST(Regions, ADestinationItsPiecesLeaveAHoleInIsNamedWithTheElementsWritten) {
  World w;
  const int a = w.Global("a", {8, 4});
  w.Hold(0, a, Whole({8, 4}));
  const uint32_t d = w.Destination("dst", {8, 4});
  w.Want(d, a, Box{{0, 0}, {4, 4}}, {0, 0});
  w.Want(d, a, Box{{6, 0}, {2, 4}}, {6, 0});
  auto s = ScheduleRegions(w.held, w.destinations, w.wanted, 1);
  ASSERT_STATUS_IS(kInvalidArgument, s,
                   "destination 'dst' [8, 4]: its pieces write 24 of 32 elements");
  // Filled, the same layout schedules and every element is written once.
  w.Want(d, a, Box{{4, 0}, {2, 4}}, {4, 0});
  ASSERT_OK_AND_ASSIGN(RegionSchedule whole, ScheduleRegions(w.held, w.destinations, w.wanted, 1));
  uint64_t written = 0;
  ASSERT_NO_FATAL_FAILURE(w.Execute(whole, &written));
  EXPECT_EQ(written, 8u * 4 * 4);
}

// Two pieces (of different tensors) claiming the same destination bytes are named with the range
// both write, and the coverage count is not reported on top (it would count those bytes twice).
TEST(Regions, TwoPiecesWritingTheSameBytesAreNamedWithTheRangeBothWrite) {
  World w;
  const int q = w.Global("q", {4, 4});
  const int k = w.Global("k", {4, 4});
  w.Hold(0, q, Whole({4, 4}));
  w.Hold(0, k, Whole({4, 4}));
  const uint32_t d = w.Destination("qk", {6, 4});
  w.Want(d, q, Whole({4, 4}), {0, 0});
  w.Want(d, k, Box{{0, 0}, {3, 4}}, {3, 0});  // row 3 is q's as well
  auto s = ScheduleRegions(w.held, w.destinations, w.wanted, 1);
  ASSERT_STATUS_IS(kInvalidArgument, s,
                   "destination 'qk': pieces of 'q' and 'k' both write [3:4, 0:4]");
  EXPECT_EQ(s.status().message().find("its pieces write"), std::string::npos) << s.status();
}

TEST(Regions, ShapesDtypesAndPlacementsThatDisagreeAreNamed) {
  std::vector<HeldTensor> held = {{0, "w", DType::kBFloat16, {4, 4}, Whole({4, 4})}};
  std::vector<DestinationShape> dst = {{"w", DType::kFloat32, {4, 4}}, {"x", DType::kFloat32, {2}}};
  std::vector<WantedPiece> wanted = {{0, "w", {4, 4}, Whole({4, 4}), {0, 0}},
                                     {1, "nobody", {4}, Box{{0}, {4}}, {0}}};
  auto s = ScheduleRegions(held, dst, wanted, 1);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.status().message();
  EXPECT_NE(m.find("a cast: enable SubscriberOptions.convert_dtypes"), std::string::npos) << m;
  EXPECT_NE(m.find("destination 'x' [2]: piece [0:4] of 'nobody' placed at [0] does not fit"),
            std::string::npos)
      << m;
  // With casts allowed the bf16 holder serves the f32 destination; bf16 -> fp8 stays refused.
  ASSERT_OK_AND_ASSIGN(RegionSchedule cast,
                       ScheduleRegions(held, {dst[0]}, {wanted[0]}, 1, 0, nullptr, true));
  ASSERT_EQ(cast.copies.size(), 1u);
  EXPECT_EQ(cast.copies[0].run_bytes, 32u);            // 16 bf16 elements read
  EXPECT_EQ(cast.copies[0].written_run_bytes(), 64u);  // written as float32
  EXPECT_EQ(cast.total_bytes, 32u);
  EXPECT_STATUS_IS(kInvalidArgument,
                   ScheduleRegions(held, {{"w", DType::kFloat8E4M3FN, {4, 4}}}, {wanted[0]}, 1, 0,
                                   nullptr, true),
                   "bfloat16 -> float8_e4m3fn of regions is not supported; casts are");
  // With casts on, a global shape that disagrees is the problem named, not the dtype.
  auto shape = ScheduleRegions({{0, "w", DType::kBFloat16, {4, 8}, Whole({4, 8})}}, {dst[0]},
                               {wanted[0]}, 1, 0, nullptr, true);
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().message().find("enable SubscriberOptions.convert_dtypes"),
            std::string::npos)
      << shape.status();
}

// A replica of the destination's dtype wins over one that needs a cast, whatever the load.
TEST(Regions, AHolderThatNeedsNoCastIsPreferred) {
  std::vector<HeldTensor> held = {{0, "w", DType::kFloat32, {4, 4}, Whole({4, 4})},
                                  {1, "w", DType::kBFloat16, {4, 4}, Whole({4, 4})}};
  std::vector<DestinationShape> dst = {{"w", DType::kBFloat16, {4, 4}}};
  std::vector<WantedPiece> wanted = {{0, "w", {4, 4}, Whole({4, 4}), {0, 0}}};
  std::vector<uint64_t> load = {0, 1 << 20};  // publisher 1 is the busier one
  ASSERT_OK_AND_ASSIGN(RegionSchedule s, ScheduleRegions(held, dst, wanted, 2, 0, &load, true));
  ASSERT_EQ(s.copies.size(), 1u);
  EXPECT_EQ(s.copies[0].held, 1u);
  EXPECT_EQ(s.copies[0].dst_run_bytes, 0u);
}

// Random layouts: 1-4 global tensors of 1-3 dims, each cut along a random dim into 1-4 tiles
// spread over 1-8 publishers (some tiles replicated), wanted by 1-4 subscribers as random regions,
// fused along dim 0 in random groups. Every schedule executed must write every destination element
// exactly once with the right value; removing a tile's every holder must be an error that names it.
TEST(Regions, RandomLayoutsDeliverEveryByteExactlyOnce) {
  std::mt19937 rng(20261201);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iteration = 0; iteration < 300; ++iteration) {
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    World w;
    const uint32_t sources = static_cast<uint32_t>(pick(1, 8));
    const int tensors = pick(1, 4);
    for (int t = 0; t < tensors; ++t) {
      std::vector<int64_t> shape(pick(1, 3));
      for (auto& e : shape) e = pick(1, 9);
      const int id = w.Global("t" + std::to_string(t), shape);
      const int dim = pick(0, static_cast<int>(shape.size()) - 1);
      const int tiles = std::min<int>(pick(1, 4), static_cast<int>(shape[dim]));
      for (int k = 0; k < tiles; ++k) {
        const int copies = pick(1, 2);
        for (int c = 0; c < copies; ++c) {
          w.Hold(static_cast<uint32_t>(pick(0, static_cast<int>(sources) - 1)), id,
                 EvenShard(shape, dim, tiles, k));
        }
      }
    }
    const int subscribers = pick(1, 4);
    uint64_t expected = 0;
    std::vector<World> views;
    std::vector<uint64_t> load(sources, 0);
    for (int s = 0; s < subscribers; ++s) {
      World sub = w;  // same holders, own destinations
      sub.destinations.clear();
      sub.wanted.clear();
      for (int t = 0; t < tensors; ++t) {
        const auto& shape = w.shapes[t];
        if (pick(0, 1) == 0) {  // a random sub-box as its own destination
          Box box{std::vector<int64_t>(shape.size()), std::vector<int64_t>(shape.size())};
          for (size_t d = 0; d < shape.size(); ++d) {
            box.offset[d] = pick(0, static_cast<int>(shape[d]) - 1);
            box.extent[d] = pick(1, static_cast<int>(shape[d] - box.offset[d]));
          }
          const uint32_t dst = sub.Destination("d" + std::to_string(t), box.extent);
          sub.Want(dst, t, box, std::vector<int64_t>(shape.size(), 0));
          expected += box.elements() * 4;
        } else {  // two dim-0 halves fused in swapped order (covers the whole tensor)
          const int64_t cut = shape[0] > 1 ? pick(1, static_cast<int>(shape[0]) - 1) : 0;
          Box top{std::vector<int64_t>(shape.size(), 0), shape};
          Box rest = top;
          top.extent[0] = cut;
          rest.offset[0] = cut;
          rest.extent[0] = shape[0] - cut;
          const uint32_t dst = sub.Destination("f" + std::to_string(t), shape);
          for (const WantedPiece& p :
               Fused(dst, 0, {{w.names[t], shape, rest}, {w.names[t], shape, top}})) {
            sub.wanted.push_back(p);
          }
          expected += Elements(shape) * 4;
        }
      }
      ASSERT_OK_AND_ASSIGN(RegionSchedule schedule,
                           ScheduleRegions(sub.held, sub.destinations, sub.wanted, sources,
                                           static_cast<uint32_t>(s), &load));
      uint64_t written = 0;
      sub.Execute(schedule, &written);
      EXPECT_EQ(written, schedule.total_bytes);
      views.push_back(std::move(sub));
    }
    EXPECT_EQ(std::accumulate(load.begin(), load.end(), uint64_t{0}), expected);
    // Take away every holder of one tile: whoever wanted part of it is told which range is missing.
    World& first = views[0];
    const Box gone = first.held[0].box;
    const std::string gone_name = first.held[0].name;
    std::vector<HeldTensor> fewer;
    for (const HeldTensor& h : first.held) {
      if (!(h.name == gone_name && h.box.offset == gone.offset)) fewer.push_back(h);
    }
    bool wanted_gone = false;
    for (const WantedPiece& p : first.wanted) {
      if (p.name != gone_name) continue;
      bool overlaps = true;
      for (size_t d = 0; d < gone.offset.size(); ++d) {
        overlaps = overlaps && p.box.offset[d] < gone.offset[d] + gone.extent[d] &&
                   gone.offset[d] < p.box.offset[d] + p.box.extent[d] && p.box.extent[d] > 0;
      }
      wanted_gone = wanted_gone || overlaps;
    }
    auto broken = ScheduleRegions(fewer, first.destinations, first.wanted, sources);
    if (wanted_gone) {
      ASSERT_FALSE(broken.ok());
      EXPECT_NE(broken.status().message().find("held by no publisher"), std::string::npos)
          << broken.status();
    }
  }
}

}  // namespace
}  // namespace weightsync::plan
