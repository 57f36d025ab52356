// `weightsync plan-sim`'s model of a cluster: plans every engine rank of a layout against every
// trainer rank (plan::ScheduleRegions, one shared `load` so replicated shards spread over their
// holders), counts the bytes each rank sends and receives over its NIC (between nodes) or NVLink
// (within a node), and predicts the transfer time from the links' speeds. Nothing moves: the
// prediction is bytes ÷ link speed on the busiest link, not a measurement (docs/plan_sim.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "plan/regions.h"
#include "plan_sim_layout.h"
#include "weightsync/status.h"

namespace weightsync::tools {

struct ClusterOptions {
  int64_t gpus_per_node = 8;
  // false: trainer ranks fill nodes 0.., engine ranks the nodes after them (separate pools).
  // true: engine rank r runs on trainer rank r's GPU (and node).
  bool colocated = false;
  double nic_gbps = 400;      // per rank and direction, between nodes
  double nvlink_gbps = 3600;  // per rank and direction, within a node
  // true: destinations of fp8 tensors are float8 (bf16 → fp8 converted before the bytes leave
  // the sending GPU, so the wire carries 1 byte per element; block scales are not counted).
  bool fp8 = false;
  // ≥ 0: every step sends deltas (src/delta/segment_delta.h) of this fraction of changed elements,
  // spread uniformly: each element costs delta::ExpectedDeltaBytesPerElement on the wire, or its
  // whole size where that is more than the publisher's kAuto room (delta::kAutoRoomDivisor).
  // < 0: whole tensors. Deltas of tensors converted in flight (fp8) are not built: refused.
  double changed_fraction = -1;
};

// Link kinds and directions, per rank.
enum class LinkKind { kNicSend, kNvlinkSend, kNicReceive, kNvlinkReceive };

struct BusiestLink {
  LinkKind kind = LinkKind::kNicSend;
  uint32_t rank = 0;  // trainer rank (send) or engine rank (receive)
  uint64_t bytes = 0;
  double seconds = 0;
  uint32_t tied = 0;  // other links of this kind and direction exactly as loaded
};

struct SimReport {
  uint64_t params = 0;
  uint64_t global_bytes = 0;  // the model as the trainer holds it
  uint64_t held_tensors = 0;
  uint64_t destinations = 0;    // over every engine rank
  uint64_t wanted_pieces = 0;   // over every engine rank
  uint64_t copies = 0;          // RegionCopy entries over every engine rank
  double plan_seconds = 0;      // the engine ranks' lists and their schedules, all of it
  double schedule_seconds = 0;  // inside ScheduleRegions only
  // Bytes on the wire (destination dtype).
  std::vector<uint64_t> sent;                   // per trainer rank
  std::vector<uint64_t> received;               // per engine rank
  std::vector<uint64_t> shard;                  // per engine rank: the bytes of its destinations
  std::vector<uint64_t> nic_send, nvlink_send;  // per trainer rank
  std::vector<uint64_t> nic_receive, nvlink_receive;  // per engine rank
  uint64_t moved = 0;                                 // sum of `received`
  uint64_t nic_bytes = 0, nvlink_bytes = 0;
  double nic_seconds = 0, nvlink_seconds = 0;
  BusiestLink busiest_nic, busiest_nvlink, busiest;
  double predicted_seconds = 0;  // max(nic_seconds, nvlink_seconds)
  // Filled by the caller (the CLI reads /proc): RSS before the layout was built, and VmHWM after.
  uint64_t rss_before = 0, peak_rss = 0;
  double layout_seconds = 0;
  std::string machine;  // where the planning ran, e.g. "AMD EPYC ..., 2 cores, ...; load 4.1"
};

// Called after each engine rank is planned (tests inspect every copy).
using ScheduleObserver =
    std::function<void(uint32_t rank, const EngineRank& wants, const plan::RegionSchedule& s)>;

// Plans every engine rank (in PlanningOrder; rotation = rank). A layout the planner rejects (e.g.
// uncovered ranges) fails with the first failing engine rank's error, which lists every problem.
Result<SimReport> SimulateCluster(const SimLayout& layout, const ClusterOptions& options,
                                  const ScheduleObserver& observe = {});

// The order engine ranks are planned in: bit-reversed (0, 64, 32, 96, 16, ... of 128). Neighbouring
// engine ranks want the same trainer ranks' experts; planned far apart, every trainer rank's
// expert bytes (which only it can send) enter the shared load early and evenly, so the
// replicated bytes planned around them balance the total instead of piling onto the trainer
// ranks whose experts come last.
std::vector<uint32_t> PlanningOrder(uint32_t ranks);

// The node a rank runs on.
int64_t TrainerNode(const ClusterOptions& o, uint32_t rank);
int64_t EngineNode(const ClusterOptions& o, const SimLayout& layout, uint32_t rank);

// The report as the CLI prints it.
std::string FormatReport(const SimLayout& layout, const ClusterOptions& options,
                         const SimReport& report);

// Decimal units, as link speeds are quoted: "20.71 GB" (fanout-sim prints the same way).
std::string DecimalBytes(uint64_t n);

}  // namespace weightsync::tools
