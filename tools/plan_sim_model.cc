#include "plan_sim_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "delta/segment_delta.h"

namespace weightsync::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double LinkSeconds(uint64_t bytes, double gbps) {
  return static_cast<double>(bytes) * 8 / (gbps * 1e9);
}

// The busiest of one kind of link, ties to the lowest rank.
BusiestLink Busiest(const std::vector<uint64_t>& bytes, LinkKind kind, double gbps) {
  BusiestLink b{kind, 0, 0, 0, 0};
  for (uint32_t r = 0; r < bytes.size(); ++r) {
    if (bytes[r] > b.bytes) b = {kind, r, bytes[r], 0, 0};
  }
  for (uint32_t r = b.rank + 1; r < bytes.size(); ++r) b.tied += bytes[r] == b.bytes ? 1 : 0;
  b.seconds = LinkSeconds(b.bytes, gbps);
  return b;
}

// Decimal units, as link speeds are quoted: "20.71 GB".
std::string Bytes(uint64_t n) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string MiB(uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MiB", static_cast<double>(n) / (1 << 20));
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Ms(double seconds) { return Fixed(seconds * 1e3, 0) + " ms"; }

struct Spread {
  uint64_t min = 0, median = 0, max = 0;
  double mean = 0;
};

Spread Of(std::vector<uint64_t> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v[v.size() / 2];
  s.mean = static_cast<double>(std::accumulate(v.begin(), v.end(), uint64_t{0})) /
           static_cast<double>(v.size());
  return s;
}

std::string SpreadText(const Spread& s) {
  return Bytes(s.min) + " / " + Bytes(s.median) + " / " + Bytes(s.max);
}

std::string Tied(const BusiestLink& b) {
  return b.tied == 0 ? "" : " (and " + std::to_string(b.tied) + " more as loaded)";
}

std::string LinkName(const BusiestLink& b) {
  switch (b.kind) {
    case LinkKind::kNicSend:
      return "trainer rank " + std::to_string(b.rank) + " NIC, sending";
    case LinkKind::kNvlinkSend:
      return "trainer rank " + std::to_string(b.rank) + " NVLink, sending";
    case LinkKind::kNicReceive:
      return "engine rank " + std::to_string(b.rank) + " NIC, receiving";
    case LinkKind::kNvlinkReceive:
      return "engine rank " + std::to_string(b.rank) + " NVLink, receiving";
  }
  return "?";
}

int64_t Nodes(int64_t ranks, int64_t per_node) { return (ranks + per_node - 1) / per_node; }

// "node 3" or "nodes 3-7".
std::string NodeRange(int64_t first, int64_t count) {
  if (count == 1) return "node " + std::to_string(first);
  return "nodes " + std::to_string(first) + "-" + std::to_string(first + count - 1);
}

}  // namespace

std::string DecimalBytes(uint64_t n) { return Bytes(n); }

std::vector<uint32_t> PlanningOrder(uint32_t ranks) {
  uint32_t bits = 0;
  while ((uint64_t{1} << bits) < ranks) ++bits;
  std::vector<uint32_t> order;
  for (uint64_t i = 0; i < (uint64_t{1} << bits); ++i) {
    uint32_t reversed = 0;
    for (uint32_t b = 0; b < bits; ++b)
      reversed |= static_cast<uint32_t>((i >> b) & 1) << (bits - 1 - b);
    if (reversed < ranks) order.push_back(reversed);
  }
  return order;
}

int64_t TrainerNode(const ClusterOptions& o, uint32_t rank) { return rank / o.gpus_per_node; }

int64_t EngineNode(const ClusterOptions& o, const SimLayout& layout, uint32_t rank) {
  if (o.colocated) return TrainerNode(o, rank);
  return Nodes(layout.trainer_ranks, o.gpus_per_node) + rank / o.gpus_per_node;
}

Result<SimReport> SimulateCluster(const SimLayout& layout, const ClusterOptions& o,
                                  const ScheduleObserver& observe) {
  if (o.gpus_per_node < 1 || !(o.nic_gbps > 0) || !(o.nvlink_gbps > 0)) {
    return Status::InvalidArgument("gpus per node (", o.gpus_per_node, "), NIC (", o.nic_gbps,
                                   " Gb/s) and NVLink (", o.nvlink_gbps, " Gb/s) must be positive");
  }
  if (o.colocated && layout.engine_ranks > layout.trainer_ranks) {
    return Status::InvalidArgument(
        "--colocated puts engine rank r on trainer rank r's GPU: ", layout.engine_ranks,
        " engine ranks need at least as many "
        "trainer ranks, the layout has ",
        layout.trainer_ranks);
  }
  if (o.changed_fraction > 1 || (o.changed_fraction >= 0 && o.fp8)) {
    return Status::InvalidArgument(
        "changed fraction ", o.changed_fraction,
        o.fp8 ? ": deltas of tensors converted in flight (fp8) are not built (docs/deltas.md)"
              : ": expected at most 1");
  }
  SimReport r;
  r.params = layout.params();
  r.global_bytes = r.params * static_cast<uint64_t>(Info(layout.dtype).bits / 8);
  r.held_tensors = layout.held.size();
  r.sent.assign(layout.trainer_ranks, 0);
  r.nic_send.assign(layout.trainer_ranks, 0);
  r.nvlink_send.assign(layout.trainer_ranks, 0);
  r.received.assign(layout.engine_ranks, 0);
  r.shard.assign(layout.engine_ranks, 0);
  r.nic_receive.assign(layout.engine_ranks, 0);
  r.nvlink_receive.assign(layout.engine_ranks, 0);
  std::vector<int64_t> trainer_node(layout.trainer_ranks);
  for (uint32_t t = 0; t < layout.trainer_ranks; ++t) trainer_node[t] = TrainerNode(o, t);

  const uint64_t held_element = static_cast<uint64_t>(Info(layout.dtype).bits / 8);
  // Deltas: the expected bytes per element by wire element size (the model sums 257 binomial
  // terms: once here, not per copy).
  std::vector<double> delta_element(held_element + 1, 0);
  for (uint64_t e = 1; o.changed_fraction >= 0 && e <= held_element; ++e) {
    delta_element[e] =
        delta::ExpectedWireBytesPerElement(o.changed_fraction, static_cast<uint32_t>(e));
  }
  std::vector<uint64_t> load(layout.trainer_ranks, 0);
  const Clock::time_point start = Clock::now();
  const plan::HeldRegions held(layout.held, layout.trainer_ranks);  // indexed once for all
  EngineRank wants;
  Status first_error;
  uint32_t failed = 0, first_failed = 0;
  for (uint32_t e : PlanningOrder(layout.engine_ranks)) {
    layout.engine_rank(e, &wants);
    r.destinations += wants.destinations.size();
    r.wanted_pieces += wants.wanted.size();
    const Clock::time_point scheduling = Clock::now();
    Result<plan::RegionSchedule> s =
        plan::ScheduleRegions(held, wants.destinations, wants.wanted, /*rotation=*/e, &load);
    r.schedule_seconds += Seconds(scheduling);
    if (!s.ok()) {
      if (failed++ == 0) {
        first_error = s.status();
        first_failed = e;
      }
      continue;
    }
    // Bytes on the wire per destination element: the destination's dtype.
    std::vector<uint64_t> wire_element(wants.destinations.size(), held_element);
    for (size_t d = 0; d < wants.destinations.size(); ++d) {
      if (o.fp8 && wants.fp8[d]) wire_element[d] = 1;
      uint64_t elements = 1;
      for (int64_t x : wants.destinations[d].shape) elements *= static_cast<uint64_t>(x);
      r.shard[e] += elements * wire_element[d];
    }
    const int64_t engine_node = EngineNode(o, layout, e);
    for (const plan::RegionCopy& c : s->copies) {
      const uint64_t elements = c.bytes() / held_element;
      const uint64_t bytes =
          o.changed_fraction < 0
              ? elements * wire_element[c.destination]
              : static_cast<uint64_t>(std::llround(static_cast<double>(elements) *
                                                   delta_element[wire_element[c.destination]]));
      const uint32_t source = layout.held[c.held].source;
      r.sent[source] += bytes;
      r.received[e] += bytes;
      if (trainer_node[source] == engine_node) {
        r.nvlink_send[source] += bytes;
        r.nvlink_receive[e] += bytes;
      } else {
        r.nic_send[source] += bytes;
        r.nic_receive[e] += bytes;
      }
    }
    r.copies += s->copies.size();
    if (observe) observe(e, wants, *s);
  }
  r.plan_seconds = Seconds(start);
  if (failed > 0) {
    return Status::InvalidArgument(failed, " of ", layout.engine_ranks,
                                   " engine ranks cannot be planned; engine rank ", first_failed,
                                   ": ", first_error.message());
  }
  r.moved = std::accumulate(r.received.begin(), r.received.end(), uint64_t{0});
  r.nic_bytes = std::accumulate(r.nic_receive.begin(), r.nic_receive.end(), uint64_t{0});
  r.nvlink_bytes = std::accumulate(r.nvlink_receive.begin(), r.nvlink_receive.end(), uint64_t{0});
  const BusiestLink nic[] = {Busiest(r.nic_send, LinkKind::kNicSend, o.nic_gbps),
                             Busiest(r.nic_receive, LinkKind::kNicReceive, o.nic_gbps)};
  const BusiestLink nvl[] = {Busiest(r.nvlink_send, LinkKind::kNvlinkSend, o.nvlink_gbps),
                             Busiest(r.nvlink_receive, LinkKind::kNvlinkReceive, o.nvlink_gbps)};
  r.busiest_nic = nic[1].seconds > nic[0].seconds ? nic[1] : nic[0];
  r.busiest_nvlink = nvl[1].seconds > nvl[0].seconds ? nvl[1] : nvl[0];
  r.nic_seconds = r.busiest_nic.seconds;
  r.nvlink_seconds = r.busiest_nvlink.seconds;
  r.busiest = r.nvlink_seconds > r.nic_seconds ? r.busiest_nvlink : r.busiest_nic;
  r.predicted_seconds = std::max(r.nic_seconds, r.nvlink_seconds);
  return r;
}

std::string FormatReport(const SimLayout& layout, const ClusterOptions& o, const SimReport& r) {
  std::ostringstream os;
  const Spread sent = Of(r.sent), received = Of(r.received), shard = Of(r.shard);
  double ratio_lo = 1e300, ratio_hi = 0;
  for (size_t e = 0; e < r.received.size(); ++e) {
    const double x = r.shard[e] == 0
                         ? 1.0
                         : static_cast<double>(r.received[e]) / static_cast<double>(r.shard[e]);
    ratio_lo = std::min(ratio_lo, x);
    ratio_hi = std::max(ratio_hi, x);
  }
  const int64_t trainer_nodes = Nodes(layout.trainer_ranks, o.gpus_per_node);
  const int64_t engine_nodes = Nodes(layout.engine_ranks, o.gpus_per_node);
  const std::string elem(Info(layout.dtype).name);
  os << "plan-sim: " << layout.name << ", " << Fixed(static_cast<double>(r.params) / 1e9, 1)
     << " billion params (" << r.params << "), " << Bytes(r.global_bytes) << " as " << elem << "\n";
  os << "  trainer  " << layout.trainer << "\n           on " << NodeRange(0, trainer_nodes) << " ("
     << o.gpus_per_node << " GPUs per node)\n";
  os << "  engine   " << layout.engine << "\n           ";
  if (o.colocated) {
    os << "colocated: engine rank r on trainer rank r's GPU (" << NodeRange(0, engine_nodes)
       << ")\n";
  } else {
    os << "on " << NodeRange(trainer_nodes, engine_nodes)
       << ", a pool of their own (--colocated: engine rank r on trainer rank r's GPU)\n";
  }
  os << "  wire     "
     << (o.fp8 ? "fp8 e4m3 for linear-layer weights, bf16 for the rest (converted on the sending\n"
                 "           GPU: 1 byte per element on the wire; block scales not counted)"
               : elem + " (as held)")
     << "\n";
  if (o.changed_fraction >= 0) {
    const uint32_t e = Info(layout.dtype).bits / 8;
    const double model = delta::ExpectedDeltaBytesPerElement(o.changed_fraction, e);
    os << "           deltas: " << Fixed(100 * o.changed_fraction, 2)
       << "% of elements changed, spread uniformly -> " << Fixed(100 * model / e, 2)
       << "% of the bytes"
       << (delta::ExpectedWireBytesPerElement(o.changed_fraction, e) > model
               ? ",\n           more than the publisher's kAuto room (1/" +
                     std::to_string(delta::kAutoRoomDivisor) + "): sent whole"
           : model >= e ? std::string(" (sent whole)")
                        : std::string())
       << "\n           (the segment delta's size model, docs/deltas.md; encode "
          "and apply time not modelled)\n";
  }
  os << "planning (" << layout.engine_ranks << " ScheduleRegions calls, one shared load vector)\n";
  os << "  inputs          " << r.held_tensors << " held tensors, " << r.destinations
     << " destinations with " << r.wanted_pieces << " wanted pieces -> " << r.copies << " copies\n";
  if (!r.machine.empty()) os << "  machine         " << r.machine << "\n";
  if (r.layout_seconds > 0) os << "  layout build    " << Ms(r.layout_seconds) << "\n";
  os << "  planning time   " << Ms(r.plan_seconds) << " wall (in ScheduleRegions "
     << Ms(r.schedule_seconds) << "); target <= 1 s: " << (r.plan_seconds <= 1 ? "met" : "MISSED")
     << "\n";
  if (r.peak_rss > 0) {
    const uint64_t growth = r.peak_rss > r.rss_before ? r.peak_rss - r.rss_before : 0;
    os << "  peak memory     " << MiB(growth) << " RSS growth (VmHWM " << MiB(r.peak_rss)
       << ", RSS before " << MiB(r.rss_before)
       << "); target <= 1 GiB: " << (growth <= (uint64_t{1} << 30) ? "met" : "MISSED") << "\n";
  }
  os << "bytes on the wire\n";
  os << "  moved in all    " << Bytes(r.moved) << " ("
     << Fixed(static_cast<double>(r.moved) / static_cast<double>(r.global_bytes), 2)
     << "x the model as held)\n";
  os << "  sent per trainer rank     min / median / max  " << SpreadText(sent) << " (max / mean "
     << Fixed(sent.mean > 0 ? static_cast<double>(sent.max) / sent.mean : 0, 2) << "x)\n";
  os << "  received per engine rank  min / median / max  " << SpreadText(received) << "\n";
  os << (o.changed_fraction < 0 ? "  its shard (the minimum)   min / median / max  "
                                : "  its shard, whole          min / median / max  ")
     << SpreadText(shard) << "\n";
  os << "  received / shard          " << Fixed(ratio_lo, 2) << "x - " << Fixed(ratio_hi, 2)
     << "x\n";
  os << "links (per rank and direction): NIC " << Fixed(o.nic_gbps, 0)
     << " Gb/s between nodes, NVLink " << Fixed(o.nvlink_gbps, 0) << " Gb/s within a node\n";
  os << "  NIC             " << Bytes(r.nic_bytes) << " in all; busiest " << LinkName(r.busiest_nic)
     << ", " << Bytes(r.busiest_nic.bytes) << " -> " << Fixed(r.nic_seconds, 3) << " s"
     << Tied(r.busiest_nic) << "\n";
  os << "  NVLink          " << Bytes(r.nvlink_bytes) << " in all";
  if (r.nvlink_bytes > 0) {
    os << "; busiest " << LinkName(r.busiest_nvlink) << ", " << Bytes(r.busiest_nvlink.bytes)
       << " -> " << Fixed(r.nvlink_seconds, 3) << " s" << Tied(r.busiest_nvlink);
  }
  os << "\n  most loaded     " << LinkName(r.busiest) << ", " << Bytes(r.busiest.bytes)
     << Tied(r.busiest) << "\n";
  os << "predicted transfer time  " << Fixed(r.predicted_seconds, 3)
     << " s  (the most loaded link's bytes / its speed)\n";
  os << "  NIC and NVLink run concurrently; one after the other: "
     << Fixed(r.nic_seconds + r.nvlink_seconds, 3) << " s\n";
  os << "  a prediction from link speeds, not a measurement: no congestion, latency, protocol\n"
        "  overhead or conversion time is modelled (docs/plan_sim.md)\n";
  if (layout.name == "kimi-k2") {
    os << "  measured elsewhere, Kimi-K2 256 -> 128 GPUs: Perplexity 1.3 s (bf16 -> fp8); vLLM\n"
          "  sharded_rdt 7.5 s (7.9 TB moved to 16x8 H100)\n";
  }
  return os.str();
}

}  // namespace weightsync::tools
