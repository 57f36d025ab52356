// `weightsync plan-sim`: its layouts (what every trainer rank holds, what every engine rank
// wants), the cluster model (every destination byte scheduled exactly once, each engine rank
// receives exactly its shard, bytes on NIC vs NVLink, fp8 on the wire), a layout with a missing
// holder failing with the planner's one error, and the CLI end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "delta/segment_delta.h"
#include "fanout_model.h"
#include "model_presets.h"
#include "plan_sim_layout.h"
#include "plan_sim_model.h"
#include "testing/status_matchers.h"

namespace weightsync::tools {
namespace {

namespace fs = std::filesystem;

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t e : shape) n *= static_cast<uint64_t>(e);
  return n;
}

SimLayout Qwen() {
  Result<SimLayout> layout = FindLayout("qwen2.5-7b", "", "");
  EXPECT_TRUE(layout.ok()) << layout.status();
  return std::move(*layout);
}

// Runs every engine rank and checks each destination: the copies' byte runs never overlap, stay
// inside the destination and the held tensor, and add up to the destination's bytes.
SimReport CheckEveryByteOnce(const SimLayout& layout, const ClusterOptions& options) {
  uint64_t checked = 0;
  Result<SimReport> report = SimulateCluster(
      layout, options, [&](uint32_t rank, const EngineRank& wants, const plan::RegionSchedule& s) {
        std::vector<std::vector<std::pair<uint64_t, uint64_t>>> runs(wants.destinations.size());
        for (const plan::RegionCopy& c : s.copies) {
          const plan::HeldTensor& h = layout.held[c.held];
          ASSERT_LE(c.src_offset + (c.rows - 1) * c.src_pitch + c.run_bytes,
                    Elements(h.box.extent) * 2)
              << "read past held tensor '" << h.name << "' of trainer rank " << h.source;
          for (uint64_t r = 0; r < c.rows; ++r) {
            const uint64_t at = c.dst_offset + r * c.dst_pitch;
            runs[c.destination].push_back({at, at + c.run_bytes});
          }
        }
        for (size_t d = 0; d < runs.size(); ++d) {
          const std::string& name = wants.destinations[d].name;
          std::sort(runs[d].begin(), runs[d].end());
          uint64_t covered = 0, end = 0;
          for (const auto& [lo, hi] : runs[d]) {
            ASSERT_GE(lo, end) << "engine rank " << rank << " '" << name << "': byte " << lo
                               << " written twice";
            covered += hi - lo;
            end = hi;
          }
          const uint64_t bytes = Elements(wants.destinations[d].shape) * 2;
          ASSERT_LE(end, bytes) << "engine rank " << rank << " '" << name << "': write past it";
          ASSERT_EQ(covered, bytes) << "engine rank " << rank << " '" << name << "'";
          ++checked;
        }
      });
  EXPECT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(checked, report.ok() ? report->destinations : 0) << "every destination checked";
  return report.ok() ? *report : SimReport{};
}

TEST(PlanSimLayout, QwenGlobalsAreTheModelPresetsTensors) {
  const SimLayout layout = Qwen();
  Result<ArchConfig> config = FindPreset("qwen2.5-7b");
  ASSERT_TRUE(config.ok());
  Result<std::vector<TensorSpec>> specs = BuildTensors(*config, DType::kBFloat16);
  ASSERT_TRUE(specs.ok());
  std::map<std::string, std::vector<int64_t>> want, have;
  for (const TensorSpec& s : *specs) want[s.name] = s.shape;
  for (const GlobalTensor& g : layout.globals) have[g.name] = g.shape;
  EXPECT_EQ(have, want);
  EXPECT_EQ(layout.trainer_ranks, 4u);
  EXPECT_EQ(layout.engine_ranks, 2u);
  // FSDP-4: every tensor in four dim-0 shards, one per rank, together exactly the tensor.
  std::vector<uint64_t> held(layout.globals.size(), 0);
  for (size_t i = 0; i < layout.held.size(); ++i) {
    held[layout.held_global[i]] += layout.held[i].box.elements();
    EXPECT_EQ(layout.held[i].name, layout.globals[layout.held_global[i]].name);
  }
  for (size_t g = 0; g < layout.globals.size(); ++g) {
    EXPECT_EQ(held[g], layout.globals[g].elements()) << layout.globals[g].name;
  }
}

TEST(PlanSimModel, QwenEveryDestinationByteOnceAndEachEngineRankGetsExactlyItsShard) {
  const SimLayout layout = Qwen();
  ClusterOptions o;
  const SimReport r = CheckEveryByteOnce(layout, o);
  ASSERT_EQ(r.received.size(), 2u);
  // Each engine rank holds half of every split tensor plus the norms: its shard is the minimum it
  // must receive, and the schedule moves exactly that.
  uint64_t replicated = 0;
  for (const GlobalTensor& g : layout.globals) {
    if (g.name.find("norm") != std::string::npos) replicated += g.elements() * 2;
  }
  const uint64_t model = layout.params() * 2;
  for (uint32_t e = 0; e < 2; ++e) {
    EXPECT_EQ(r.shard[e], (model - replicated) / 2 + replicated) << "engine rank " << e;
    EXPECT_EQ(r.received[e], r.shard[e]) << "engine rank " << e;
  }
  EXPECT_EQ(r.moved, model + replicated);
  EXPECT_EQ(std::accumulate(r.sent.begin(), r.sent.end(), uint64_t{0}), r.moved);
  // Separate node pools: everything crosses a NIC.
  EXPECT_EQ(r.nic_bytes, r.moved);
  EXPECT_EQ(r.nvlink_bytes, 0u);
  const uint64_t busiest = std::max(*std::max_element(r.sent.begin(), r.sent.end()),
                                    *std::max_element(r.received.begin(), r.received.end()));
  EXPECT_EQ(r.busiest.bytes, busiest);
  EXPECT_DOUBLE_EQ(r.predicted_seconds, static_cast<double>(busiest) * 8 / 400e9);
  EXPECT_NE(FormatReport(layout, o, r).find("received / shard          1.00x - 1.00x"),
            std::string::npos)
      << FormatReport(layout, o, r);
}

TEST(PlanSimModel, ColocatedRanksOnOneNodeUseNvlink) {
  const SimLayout layout = Qwen();
  ClusterOptions o;
  o.colocated = true;  // engine ranks 0, 1 on trainer ranks 0, 1's GPUs: all four on node 0
  const SimReport r = CheckEveryByteOnce(layout, o);
  EXPECT_EQ(r.nic_bytes, 0u);
  EXPECT_EQ(r.nvlink_bytes, r.moved);
  EXPECT_EQ(r.busiest.kind == LinkKind::kNvlinkSend || r.busiest.kind == LinkKind::kNvlinkReceive,
            true);
  EXPECT_DOUBLE_EQ(r.predicted_seconds, static_cast<double>(r.busiest.bytes) * 8 / 3600e9);
  // Two ranks per node: trainer ranks 0-1 on node 0, 2-3 on node 1, engine ranks on 0 and 1.
  o.gpus_per_node = 2;
  const SimReport split = CheckEveryByteOnce(layout, o);
  EXPECT_GT(split.nic_bytes, 0u);
  EXPECT_GT(split.nvlink_bytes, 0u);
  EXPECT_EQ(split.nic_bytes + split.nvlink_bytes, split.moved);
}

TEST(PlanSimModel, Fp8HalvesTheLinearWeightsOnTheWire) {
  const SimLayout layout = Qwen();
  ClusterOptions o;
  const SimReport bf16 = CheckEveryByteOnce(layout, o);
  o.fp8 = true;
  const SimReport fp8 = CheckEveryByteOnce(layout, o);
  // Linear weights are split in two (one copy of each over both engine ranks); embeddings,
  // lm_head and biases too; norms go to both and stay bf16.
  uint64_t expected = 0;
  for (const GlobalTensor& g : layout.globals) {
    const uint64_t copies = g.name.find("norm") != std::string::npos ? 2 : 1;
    expected += g.elements() * copies * (g.fp8 ? 1 : 2);
  }
  EXPECT_EQ(fp8.moved, expected);
  uint64_t fp8_elements = 0;  // each sent once, one byte instead of two
  for (const GlobalTensor& g : layout.globals) fp8_elements += g.fp8 ? g.elements() : 0;
  EXPECT_EQ(bf16.moved - fp8.moved, fp8_elements);
  for (uint32_t e = 0; e < 2; ++e) EXPECT_EQ(fp8.received[e], fp8.shard[e]);
}

TEST(PlanSimModel, DeltasScaleEveryLinkByTheDeltaSizeModel) {
  const SimLayout layout = Qwen();
  ClusterOptions o;
  Result<SimReport> whole = SimulateCluster(layout, o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  o.changed_fraction = 0.02;
  Result<SimReport> sparse = SimulateCluster(layout, o);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  const double ratio = delta::ExpectedDeltaBytesPerElement(0.02, 2) / 2;
  EXPECT_GT(ratio, 0.02);  // values, offsets and directory: more than the changed bytes alone
  EXPECT_LT(ratio, 0.04);
  for (uint32_t e = 0; e < layout.engine_ranks; ++e) {
    EXPECT_EQ(sparse->shard[e], whole->shard[e]);  // the shard is still the shard
    // Each copy rounds once: within a byte per copy of the whole bytes times the ratio.
    EXPECT_NEAR(static_cast<double>(sparse->received[e]),
                static_cast<double>(whole->received[e]) * ratio,
                static_cast<double>(whole->copies));
  }
  EXPECT_NEAR(sparse->predicted_seconds, whole->predicted_seconds * ratio,
              1e-3 * whole->predicted_seconds);
  // 40% changed: the delta would be 46% of the bytes, more than the publisher's kAuto room (a
  // quarter), so every segment goes whole.
  ASSERT_GT(delta::ExpectedDeltaBytesPerElement(0.4, 2) * delta::kAutoRoomDivisor, 2.0);
  o.changed_fraction = 0.4;
  Result<SimReport> dense = SimulateCluster(layout, o);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->received, whole->received);
  o.changed_fraction = 1;  // every element changed: whole, no more
  Result<SimReport> all = SimulateCluster(layout, o);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->received, whole->received);
  o.fp8 = true;
  Result<SimReport> fp8 = SimulateCluster(layout, o);
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("converted in flight (fp8) are not built"),
            std::string::npos)
      << fp8.status();
}

TEST(PlanSimModel, AMissingHolderIsThePlannersOneErrorListingUncoveredRanges) {
  SimLayout layout = Qwen();
  DropSource(&layout, 1);  // FSDP rank 1: rows [1/4, 2/4) of every tensor
  Result<SimReport> r = SimulateCluster(layout, ClusterOptions{});
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("2 of 2 engine ranks cannot be planned; engine rank 0: plan: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("tensor 'model.embed_tokens.weight' [38016:76032, 0:3584] (for destination "
                   "'model.embed_tokens.weight'): held by no publisher"),
            std::string::npos)
      << m;
  // The fused qkv_proj lacks rows of each of q, k and v.
  for (const char* part :
       {"q_proj.weight' [896:1792", "k_proj.weight' [128:256", "v_proj.weight' [128:256"}) {
    EXPECT_NE(m.find("model.layers.0.self_attn." + std::string(part)), std::string::npos)
        << part << " in\n"
        << m;
  }
}

// plan-sim indexes the trainer's holdings once (plan::HeldRegions); every engine rank's schedule,
// the shared load and every error text must equal the plain ScheduleRegions call's, also for
// holders that disagree with the piece (another dtype or shape) or name a rank out of range.
TEST(PlanSimModel, IndexedHoldersPlanExactlyLikeThePlainCall) {
  std::vector<SimLayout> layouts;
  layouts.push_back(Qwen());
  layouts.push_back(Qwen());
  DropSource(&layouts.back(), 2);
  Result<SimLayout> kimi = FindLayout("kimi-k2", "tp2,pp2,ep2", "tp2,dp2");
  ASSERT_TRUE(kimi.ok()) << kimi.status();
  layouts.push_back(*kimi);
  layouts.push_back(*kimi);
  layouts.back().held[3].dtype = DType::kFloat16;
  layouts.back().held[7].global_shape[0] += 1;
  layouts.back().held[9].source = 99;
  layouts.push_back(*kimi);  // every holder of one tensor agrees with the others, not the engine
  for (plan::HeldTensor& h : layouts.back().held) {
    if (h.name == "model.layers.0.self_attn.o_proj.weight") h.dtype = DType::kFloat16;
  }
  int failures = 0;
  for (const SimLayout& layout : layouts) {
    const plan::HeldRegions indexed(layout.held, layout.trainer_ranks);
    std::vector<uint64_t> load_plain(layout.trainer_ranks, 0), load_indexed = load_plain;
    EngineRank wants;
    for (uint32_t e = 0; e < layout.engine_ranks; ++e) {
      layout.engine_rank(e, &wants);
      Result<plan::RegionSchedule> a = plan::ScheduleRegions(
          layout.held, wants.destinations, wants.wanted, layout.trainer_ranks, e, &load_plain);
      Result<plan::RegionSchedule> b =
          plan::ScheduleRegions(indexed, wants.destinations, wants.wanted, e, &load_indexed);
      ASSERT_EQ(a.ok(), b.ok()) << layout.name << " engine rank " << e;
      EXPECT_EQ(load_plain, load_indexed);
      if (!a.ok()) {
        ++failures;
        EXPECT_EQ(a.status().message(), b.status().message());
        continue;
      }
      EXPECT_EQ(a->bytes_per_source, b->bytes_per_source);
      EXPECT_EQ(a->total_bytes, b->total_bytes);
      ASSERT_EQ(a->copies.size(), b->copies.size());
      for (size_t i = 0; i < a->copies.size(); ++i) {
        const plan::RegionCopy &x = a->copies[i], &y = b->copies[i];
        ASSERT_TRUE(x.held == y.held && x.destination == y.destination &&
                    x.src_offset == y.src_offset && x.src_pitch == y.src_pitch &&
                    x.dst_offset == y.dst_offset && x.dst_pitch == y.dst_pitch &&
                    x.run_bytes == y.run_bytes && x.rows == y.rows)
            << layout.name << " engine rank " << e << " copy " << i;
      }
    }
  }
  EXPECT_EQ(failures, 2 + 4 + 4)
      << "the dropped rank and the broken holders fail every engine rank";
}

TEST(PlanSimModel, ClusterOptionsAreChecked) {
  const SimLayout layout = Qwen();
  ClusterOptions o;
  o.gpus_per_node = 0;
  EXPECT_FALSE(SimulateCluster(layout, o).ok());
  o = {};
  o.nic_gbps = 0;
  EXPECT_FALSE(SimulateCluster(layout, o).ok());
  o = {};
  o.nvlink_gbps = -1;
  EXPECT_FALSE(SimulateCluster(layout, o).ok());
  Result<SimLayout> one = FindLayout("qwen2.5-7b", "fsdp1", "tp2");
  ASSERT_TRUE(one.ok()) << one.status();
  o = {};
  o.colocated = true;
  Result<SimReport> r = SimulateCluster(*one, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("2 engine ranks need at least as many trainer ranks"),
            std::string::npos)
      << r.status();
  o.colocated = false;
  EXPECT_TRUE(SimulateCluster(*one, o).ok());
}

TEST(PlanSimLayout, KimiK2IsAboutOneTrillionParamsAndEveryByteIsHeld) {
  Result<SimLayout> layout = FindLayout("kimi-k2", "", "");
  ASSERT_TRUE(layout.ok()) << layout.status();
  // From config.json: 61 layers (layer 0 dense), hidden 7168, MLA, 384 + 1 experts of 2048,
  // vocab 163840 (embedding and lm_head untied).
  const uint64_t h = 7168, e = 384, i = 2048, v = 163840;
  const uint64_t attention =
      1536 * h + 1536 + 12288 * 1536 + 576 * h + 512 + 16384 * 512 + h * 8192 + 2 * h;
  const uint64_t moe = e * h + e + 3 * i * h + 3 * e * i * h;
  const uint64_t expected = 2 * v * h + h + 61 * attention + 3 * 18432 * h + 60 * moe;
  EXPECT_EQ(layout->params(), expected);
  EXPECT_EQ(layout->params(), uint64_t{1026408232448});
  // Kimi-K2 is "1T": 1.026 T with its config (the checkpoint's own count, 2.6% above 1.0 T).
  EXPECT_NEAR(static_cast<double>(layout->params()) / 1e12, 1.0, 0.03);
  EXPECT_EQ(layout->trainer_ranks, 256u);
  EXPECT_EQ(layout->engine_ranks, 128u);
  // Experts are held once (EP8 x ETP8 over the 64 ranks of their stage); tensor-parallel tensors
  // once per data-parallel (= EP) replica, 8 times; replicated ones (norms, the router, MLA's
  // down-projections) by each of the stage's 64 ranks.
  std::vector<uint64_t> held(layout->globals.size(), 0);
  for (size_t k = 0; k < layout->held.size(); ++k) {
    held[layout->held_global[k]] += layout->held[k].box.elements();
  }
  auto has = [](const std::string& name, const char* part) {
    return name.find(part) != std::string::npos;
  };
  for (size_t g = 0; g < layout->globals.size(); ++g) {
    const GlobalTensor& t = layout->globals[g];
    const bool replicated = has(t.name, "norm") || has(t.name, "_a_proj") ||
                            has(t.name, "mlp.gate.") || has(t.name, "kv_a_proj_with_mqa");
    const uint64_t copies = has(t.name, ".mlp.experts.") ? 1 : replicated ? 64 : 8;
    ASSERT_EQ(held[g], t.elements() * copies) << t.name;
  }
  // Engine rank 5: 3 whole experts (15..17) per layer, TP8 attention, replicated norms.
  EngineRank wants;
  layout->engine_rank(5, &wants);
  uint64_t bytes = 0;
  for (const plan::DestinationShape& d : wants.destinations) {
    bytes += Elements(d.shape) * 2;
    if (d.name == "model.layers.1.mlp.experts.w13_weight") {
      EXPECT_EQ(d.shape, (std::vector<int64_t>{3, 4096, 7168}));
    }
    if (d.name == "model.layers.1.self_attn.fused_qkv_a_proj.weight") {
      EXPECT_EQ(d.shape, (std::vector<int64_t>{1536 + 576, 7168}));
    }
    if (d.name == "model.layers.0.mlp.gate_up_proj.weight") {
      EXPECT_EQ(d.shape, (std::vector<int64_t>{2 * 18432 / 8, 7168}));
    }
  }
  EXPECT_GT(bytes, uint64_t{19'000'000'000});
  EXPECT_LT(bytes, uint64_t{22'000'000'000});
  bool w13 = false;
  for (const plan::WantedPiece& p : wants.wanted) {
    if (p.name == "model.layers.1.mlp.experts.w3") {
      w13 = true;
      EXPECT_EQ(p.box.offset, (std::vector<int64_t>{15, 0, 0}));
      EXPECT_EQ(p.at, (std::vector<int64_t>{0, 2048, 0})) << "up after gate, along dim 1";
    }
  }
  EXPECT_TRUE(w13);
}

TEST(PlanSimModel, PlanningOrderIsBitReversed) {
  EXPECT_EQ(PlanningOrder(8), (std::vector<uint32_t>{0, 4, 2, 6, 1, 5, 3, 7}));
  EXPECT_EQ(PlanningOrder(5), (std::vector<uint32_t>{0, 4, 2, 1, 3}));
  EXPECT_EQ(PlanningOrder(1), (std::vector<uint32_t>{0}));
  for (uint32_t n : {2u, 3u, 7u, 128u, 300u}) {
    std::vector<uint32_t> order = PlanningOrder(n);
    std::sort(order.begin(), order.end());
    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(order[i], i) << "not a permutation of " << n;
    ASSERT_EQ(order.size(), n);
  }
}

// The whole Kimi-K2 cluster: 128 engine ranks planned against 256 trainer ranks.
TEST(PlanSimModel, KimiK2EveryEngineRankGetsExactlyItsShard) {
  Result<SimLayout> layout = FindLayout("kimi-k2", "", "");
  ASSERT_TRUE(layout.ok()) << layout.status();
  Result<SimReport> r = SimulateCluster(*layout, ClusterOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  for (uint32_t e = 0; e < 128; ++e) {
    ASSERT_EQ(r->received[e], r->shard[e]) << "engine rank " << e;
    ASSERT_EQ(r->shard[e], r->shard[0]) << "engine rank " << e;
  }
  // 3 of 384 experts x 60 layers, TP8 attention and dense, replicated MLA down-projections,
  // norms and router: 20.69 GB per engine rank; 16 attention replicas move 1.29x the model.
  EXPECT_GT(r->shard[0], uint64_t{20'600'000'000});
  EXPECT_LT(r->shard[0], uint64_t{20'800'000'000});
  EXPECT_EQ(r->moved, r->shard[0] * 128);
  EXPECT_EQ(std::accumulate(r->sent.begin(), r->sent.end(), uint64_t{0}), r->moved);
  // Engine ranks receive over their NICs (separate node pools): the most loaded link.
  EXPECT_EQ(r->busiest.kind, LinkKind::kNicReceive);
  EXPECT_EQ(r->busiest.bytes, r->shard[0]);
  EXPECT_EQ(r->busiest.rank, 0u);
  EXPECT_EQ(r->busiest.tied, 127u) << "every engine rank receives as much";
  EXPECT_NEAR(r->predicted_seconds, static_cast<double>(r->shard[0]) * 8 / 400e9, 1e-12);
  // Replicated bytes spread over their holders: in PlanningOrder the busiest trainer rank sends
  // at most 1.25x the mean (1.57x when planned in rank order). The last pipeline stage holds 16 of
  // the 61 layers and the lm_head, so its ranks cannot get down to the mean.
  const double mean = static_cast<double>(r->moved) / 256;
  EXPECT_LT(static_cast<double>(*std::max_element(r->sent.begin(), r->sent.end())), 1.25 * mean);
}

TEST(PlanSimLayout, ParallelismOverridesAreChecked) {
  Result<std::map<std::string, int64_t>> p = ParseParallelism("tp8,pp4,ep8");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::map<std::string, int64_t>{{"tp", 8}, {"pp", 4}, {"ep", 8}}));
  for (const char* bad : {"tp0", "8", "tp", "tp-1", "tp8,", "t p8", "tp1234567"}) {
    EXPECT_FALSE(ParseParallelism(bad).ok()) << bad;
  }
  Result<SimLayout> small = FindLayout("kimi-k2", "tp2,pp2,ep2", "tp2,dp2");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->trainer_ranks, 8u);
  EXPECT_EQ(small->engine_ranks, 4u);
  EXPECT_FALSE(FindLayout("kimi-k2", "pp62", "").ok());   // 61 layers
  EXPECT_FALSE(FindLayout("kimi-k2", "ep385", "").ok());  // 384 experts
  EXPECT_FALSE(FindLayout("kimi-k2", "tp65", "").ok());   // 64 heads
  EXPECT_FALSE(FindLayout("kimi-k2", "", "tp65,dp1").ok());
  EXPECT_TRUE(FindLayout("kimi-k2", "tp64,pp1,ep1", "tp64,dp6").ok());  // the limits
  EXPECT_TRUE(FindLayout("kimi-k2", "tp1,pp61,ep1", "").ok());
  EXPECT_FALSE(FindLayout("qwen2.5-7b", "fsdp513", "").ok());
  EXPECT_FALSE(FindLayout("kimi-k2", "", "tp8,dp64").ok());  // 512 ranks for 384 experts
  EXPECT_FALSE(FindLayout("kimi-k2", "fsdp4", "").ok());
  EXPECT_FALSE(FindLayout("qwen2.5-7b", "", "tp8").ok());  // 4 kv heads
  EXPECT_FALSE(FindLayout("qwen2.5-7b", "", "dp2").ok());
  EXPECT_FALSE(FindLayout("gpt-17", "", "").ok());
}

// build/tests/tools_plan_sim_test → build/weightsync
std::string CliPath() {
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "weightsync").string();
}

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun RunCli(const std::string& args) {
  CliRun run;
  FILE* pipe = ::popen((CliPath() + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

class PlanSimCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(CliPath())) GTEST_SKIP() << CliPath() << " not built (WS_BUILD_CLI off)";
  }
};

TEST_F(PlanSimCli, QwenPrintsTheFigures) {
  CliRun run = RunCli("plan-sim --layout qwen2.5-7b");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* line :
       {"plan-sim: qwen2.5-7b, 7.6 billion params (7615616512)", "trainer  4 ranks: FSDP4",
        "engine   2 ranks: TP2", "planning time", "peak memory", "RSS growth (VmHWM",
        "sent per trainer rank", "received per engine rank",
        "received / shard          1.00x - 1.00x", "most loaded     engine rank", "NIC, receiving",
        "predicted transfer time", "not a measurement"}) {
    EXPECT_NE(run.output.find(line), std::string::npos) << line << " missing from:\n" << run.output;
  }
  CliRun fp8 = RunCli("plan-sim --layout qwen2.5-7b --dtype-out fp8 --colocated --nvlink-gbps 900");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  EXPECT_NE(fp8.output.find("NVLink, "), std::string::npos) << fp8.output;
  EXPECT_NE(fp8.output.find("fp8 e4m3"), std::string::npos) << fp8.output;
  EXPECT_NE(fp8.output.find("NVLink 900 Gb/s"), std::string::npos) << fp8.output;
  CliRun help = RunCli("plan-sim --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag :
       {"--layout", "--nic-gbps", "--nvlink-gbps", "--gpus-per-node", "--colocated", "--dtype-out",
        "--trainer", "--engine", "--drop-source"}) {
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag << "\n" << help.output;
  }
  EXPECT_NE(RunCli("--help").output.find("plan-sim"), std::string::npos);
}

TEST_F(PlanSimCli, DroppedSourceExits1WithThePlannersError) {
  CliRun run = RunCli("plan-sim --layout qwen2.5-7b --drop-source 1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("2 of 2 engine ranks cannot be planned"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("held by no publisher"), std::string::npos) << run.output;
}

TEST_F(PlanSimCli, BadFlagsExit2AndNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--layout gpt-17", "unknown layout 'gpt-17'; expected one of kimi-k2, qwen2.5-7b"},
      {"--dtype-out fp16", "--dtype-out=fp16: expected bf16 or fp8"},
      {"--nic-gbps 0", "--nic-gbps=0: expected a positive number"},
      {"--nvlink-gbps fast", "--nvlink-gbps=fast: expected a positive number"},
      {"--nic-gbps 2e9", "--nic-gbps=2e9: expected a positive number"},
      {"--gpus-per-node 0", "--gpus-per-node=0: expected at least 1"},
      {"--layout qwen2.5-7b --drop-source 4", "--drop-source=4: the layout has 4 trainer ranks"},
      {"--layout qwen2.5-7b --trainer tp0", "--trainer: 'tp0': 'tp0' is not a name followed"},
      {"--layout qwen2.5-7b --engine pp2", "--engine: 'pp' is not one of tp"},
      {"--layout qwen2.5-7b --trainer fsdp1 --colocated", "need at least as many trainer ranks"},
      {"--trainer pp62", "do not fit 61 layers"},
      {"--nic-gpbs 400", "unknown flag --nic-gpbs"},
      {"--changed-fraction 2", "--changed-fraction=2: expected a number from 0 to 1"},
      {"--changed-fraction 1%", "--changed-fraction=1%: expected a number from 0 to 1"},
      {"--changed-fraction 0.02 --dtype-out fp8", "deltas of tensors converted in flight"},
  };
  for (const auto& [args, message] : cases) {
    CliRun run = RunCli("plan-sim " + args);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << args << "\n" << run.output;
  }
}

}  // namespace

// ---- fanout-sim (tools/fanout_model.h): figures computed by hand ----
namespace {

FanoutOptions TenReplicas() {
  FanoutOptions o;
  o.replicas = 10;
  o.model_bytes = 1'000'000'000;
  o.trainer_gbps = 80;  // 1e10 bytes/s
  o.replica_gbps = 80;
  o.bucket_bytes = 64ull << 20;
  return o;
}

TEST(FanoutModel, DirectTreeAndChainByHand) {
  ASSERT_OK_AND_ASSIGN(auto rows, PredictFanout(TenReplicas(), {2, 16}));
  ASSERT_EQ(rows.size(), 4u);
  const FanoutPrediction& direct = rows[0];
  EXPECT_EQ(direct.topology, Topology::kDirect);
  EXPECT_DOUBLE_EQ(direct.trainer_egress_bytes, 10e9);
  EXPECT_DOUBLE_EQ(direct.seconds(), 1.0);  // ten copies through the trainer's NIC
  const FanoutPrediction& tree = rows[1];   // 2 + 4 + 8 >= 10: three levels
  EXPECT_EQ(tree.depth, 3u);
  EXPECT_DOUBLE_EQ(tree.trainer_egress_bytes, 2e9);
  EXPECT_DOUBLE_EQ(tree.stream_seconds, 0.2);  // every sender feeds two children
  EXPECT_DOUBLE_EQ(tree.pipeline_seconds, 2 * (64.0 * 1048576) * 2 / 1e10);
  const FanoutPrediction& wide = rows[2];  // 16 children: the trainer feeds all ten itself
  EXPECT_EQ(wide.depth, 1u);
  EXPECT_DOUBLE_EQ(wide.seconds(), direct.seconds());
  const FanoutPrediction& chain = rows[3];
  EXPECT_EQ(chain.topology, Topology::kChain);
  EXPECT_EQ(chain.depth, 10u);
  EXPECT_DOUBLE_EQ(chain.trainer_egress_bytes, 1e9);
  EXPECT_DOUBLE_EQ(chain.stream_seconds, 0.1);
  EXPECT_DOUBLE_EQ(chain.pipeline_seconds, 9 * (64.0 * 1048576) / 1e10);
}

// Store-and-forward (what relays do for steps that come as deltas): each level below the first
// waits for its parent's whole step, sent to its children at the parent's share of its NIC.
TEST(FanoutModel, StoreAndForwardAddsAWholeStepPerLevel) {
  FanoutOptions o = TenReplicas();
  o.store_and_forward = true;
  ASSERT_OK_AND_ASSIGN(auto rows, PredictFanout(o, {2}));
  EXPECT_DOUBLE_EQ(rows[0].seconds(), 1.0);  // direct: no relays, nothing changes
  const FanoutPrediction& tree = rows[1];
  EXPECT_EQ(tree.depth, 3u);
  EXPECT_DOUBLE_EQ(tree.stream_seconds, 0.2);                   // the trainer feeds two children
  EXPECT_DOUBLE_EQ(tree.pipeline_seconds, 2 * 1e9 * 2 / 1e10);  // two more levels, two each
  const FanoutPrediction& chain = rows[2];
  EXPECT_DOUBLE_EQ(chain.stream_seconds, 0.1);
  EXPECT_DOUBLE_EQ(chain.pipeline_seconds, 9 * 0.1);  // ten whole transfers in a row
}

TEST(FanoutModel, ASlowTrainerLinkOrASmallModelBoundsTheStream) {
  FanoutOptions o = TenReplicas();
  o.trainer_gbps = 8;  // 1e9 bytes/s: even one copy takes a second
  ASSERT_OK_AND_ASSIGN(auto rows, PredictFanout(o, {2}));
  EXPECT_DOUBLE_EQ(rows[0].seconds(), 10.0);
  EXPECT_DOUBLE_EQ(rows[1].stream_seconds, 2.0);
  EXPECT_DOUBLE_EQ(rows[2].stream_seconds, 1.0);
  o = TenReplicas();
  o.model_bytes = 1'000'000;  // smaller than a bucket: a relay forwards the whole model at once
  ASSERT_OK_AND_ASSIGN(rows, PredictFanout(o, {2}));
  EXPECT_DOUBLE_EQ(rows[2].pipeline_seconds, 9 * 1e6 / 1e10);
}

TEST(FanoutModel, DeltasScaleEveryByteByTheWireModel) {
  FanoutOptions o = TenReplicas();
  ASSERT_OK_AND_ASSIGN(auto whole, PredictFanout(o, {4}));
  o.changed_fraction = 0.014;
  ASSERT_OK_AND_ASSIGN(auto sparse, PredictFanout(o, {4}));
  const double ratio = delta::ExpectedWireBytesPerElement(0.014, 2) / 2;
  EXPECT_GT(ratio, 0.02);
  EXPECT_LT(ratio, 0.03);
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_NEAR(sparse[i].trainer_egress_bytes, whole[i].trainer_egress_bytes * ratio, 1);
    EXPECT_NEAR(sparse[i].stream_seconds, whole[i].stream_seconds * ratio, 1e-12);
  }
  o.changed_fraction = 0.4;  // past the kAuto room: every segment whole
  EXPECT_DOUBLE_EQ(WireBytes(o), 1e9);
}

TEST(FanoutModel, BadOptionsAreRefusedByName) {
  FanoutOptions o = TenReplicas();
  o.replicas = 0;
  EXPECT_STATUS_IS(kInvalidArgument, PredictFanout(o, {2}).status(), "replicas");
  o = TenReplicas();
  o.replica_gbps = 0;
  EXPECT_STATUS_IS(kInvalidArgument, PredictFanout(o, {2}).status(), "link speeds");
  EXPECT_STATUS_IS(kInvalidArgument, PredictFanout(TenReplicas(), {1}).status(),
                   "fan-out 1: a tree needs at least 2");
  o = TenReplicas();
  o.changed_fraction = 1.5;
  EXPECT_STATUS_IS(kInvalidArgument, PredictFanout(o, {2}).status(), "changed fraction 1.5");
}

TEST_F(PlanSimCli, FanoutSimPrintsEveryTopology) {
  CliRun run = RunCli("fanout-sim --replicas 1000 --changed-fraction 0.014");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* line : {"fanout-sim: 1000 replicas of", "deltas: 1.40% of elements changed",
                           "direct", "tree", "chain", "all hold it", "not a measurement"}) {
    EXPECT_NE(run.output.find(line), std::string::npos) << line << " missing from:\n" << run.output;
  }
  CliRun stored = RunCli("fanout-sim --replicas 16 --model-bytes 128M --store-and-forward");
  ASSERT_EQ(stored.exit_code, 0) << stored.output;
  EXPECT_NE(stored.output.find("relays store and forward each step"), std::string::npos)
      << stored.output;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"fanout-sim --replicas 0", "--replicas=0: expected at least 1"},
      {"fanout-sim --trainer-gbps fast", "--trainer-gbps=fast: expected a number"},
      {"fanout-sim --changed-fraction 2", "--changed-fraction=2: expected a number from 0 to 1"},
      {"fanout-sim --layout gpt-17", "unknown layout 'gpt-17'"}};
  for (const auto& [args, message] : cases) {
    CliRun bad = RunCli(args);
    EXPECT_EQ(bad.exit_code, 2) << args << "\n" << bad.output;
    EXPECT_NE(bad.output.find(message), std::string::npos) << args << "\n" << bad.output;
  }
}

}  // namespace
}  // namespace weightsync::tools
