#include "fanout_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "delta/segment_delta.h"
#include "plan_sim_model.h"

namespace weightsync::tools {
namespace {

double BytesPerSecond(double gbps) { return gbps * 1e9 / 8; }

// Levels of a tree of fan-out f below the trainer that hold n replicas: the smallest d with
// f + f^2 + ... + f^d ≥ n.
uint32_t TreeDepth(uint64_t n, uint64_t f) {
  uint32_t depth = 0;
  for (double held = 0, level = 1; held < static_cast<double>(n); ++depth) {
    level *= static_cast<double>(f);
    held += level;
  }
  return depth;
}

// A tree of fan-out `f` (a chain is f = 1): every sender's egress is shared by its children, so
// the stream runs at the slowest sender's f-th share; each level below the first starts one
// bucket later (store-and-forward: one whole step later), forwarded at that share.
FanoutPrediction Relayed(const FanoutOptions& o, Topology topology, uint64_t f, double wire) {
  const uint64_t n = o.replicas;
  const uint64_t first = std::min(f, n);  // the trainer's own children
  FanoutPrediction p;
  p.topology = topology;
  p.fanout = f;
  p.depth = topology == Topology::kChain ? static_cast<uint32_t>(n) : TreeDepth(n, f);
  p.trainer_egress_bytes = wire * static_cast<double>(first);
  const double trainer = p.trainer_egress_bytes / BytesPerSecond(o.trainer_gbps);
  const double receive = wire / BytesPerSecond(o.replica_gbps);
  const double relay =
      p.depth > 1 ? wire * static_cast<double>(f) / BytesPerSecond(o.replica_gbps) : 0;
  // Store-and-forward: the stream is the first level's; each level after it adds a whole step at
  // its sender's share.
  p.stream_seconds =
      o.store_and_forward ? std::max(trainer, receive) : std::max({trainer, receive, relay});
  const double bucket =
      o.store_and_forward ? wire : std::min(wire, static_cast<double>(o.bucket_bytes));
  p.pipeline_seconds =
      (p.depth - 1) * bucket * static_cast<double>(f) / BytesPerSecond(o.replica_gbps);
  return p;
}

std::string Seconds(double s) {
  char out[32];
  std::snprintf(out, sizeof(out), s < 10 ? "%.3f s" : "%.1f s", s);
  return out;
}

}  // namespace

const char* TopologyName(Topology t) {
  switch (t) {
    case Topology::kDirect:
      return "direct";
    case Topology::kTree:
      return "tree";
    case Topology::kChain:
      return "chain";
  }
  return "?";
}

double WireBytes(const FanoutOptions& o) {
  const double model = static_cast<double>(o.model_bytes);
  if (o.changed_fraction < 0) return model;
  return model * delta::ExpectedWireBytesPerElement(o.changed_fraction, o.element_bytes) /
         o.element_bytes;
}

Result<std::vector<FanoutPrediction>> PredictFanout(const FanoutOptions& o,
                                                    const std::vector<uint64_t>& fanouts) {
  if (o.replicas == 0) return Status::InvalidArgument("replicas: expected at least 1");
  if (o.model_bytes == 0) return Status::InvalidArgument("model bytes: expected more than 0");
  if (!(o.trainer_gbps > 0) || !(o.replica_gbps > 0)) {
    return Status::InvalidArgument("link speeds: expected positive Gb/s, got trainer ",
                                   o.trainer_gbps, ", replica ", o.replica_gbps);
  }
  if (o.changed_fraction > 1 || o.element_bytes == 0 || o.bucket_bytes == 0) {
    return Status::InvalidArgument("changed fraction ", o.changed_fraction, ", element bytes ",
                                   o.element_bytes, ", bucket bytes ", o.bucket_bytes,
                                   ": expected a fraction ≤ 1 and sizes > 0");
  }
  const double wire = WireBytes(o);
  std::vector<FanoutPrediction> rows;
  FanoutPrediction direct;
  direct.fanout = o.replicas;
  direct.depth = 1;
  direct.trainer_egress_bytes = wire * static_cast<double>(o.replicas);
  direct.stream_seconds = std::max(direct.trainer_egress_bytes / BytesPerSecond(o.trainer_gbps),
                                   wire / BytesPerSecond(o.replica_gbps));
  rows.push_back(direct);
  for (uint64_t f : fanouts) {
    if (f < 2) return Status::InvalidArgument("fan-out ", f, ": a tree needs at least 2");
    rows.push_back(Relayed(o, Topology::kTree, f, wire));
  }
  rows.push_back(Relayed(o, Topology::kChain, 1, wire));
  return rows;
}

std::string FormatFanout(const FanoutOptions& o, const std::vector<FanoutPrediction>& rows) {
  std::ostringstream os;
  os << "fanout-sim: " << o.replicas << " replicas of " << DecimalBytes(o.model_bytes)
     << ", trainer egress " << o.trainer_gbps << " Gb/s, replica NICs " << o.replica_gbps
     << " Gb/s, "
     << (o.store_and_forward ? std::string("relays store and forward each step")
                             : "buckets of " + DecimalBytes(o.bucket_bytes))
     << "\n";
  const double wire = WireBytes(o);
  if (o.changed_fraction >= 0) {
    char line[160];
    std::snprintf(line, sizeof(line),
                  "deltas: %.2f%% of elements changed -> %.2f%% of the bytes per replica "
                  "(docs/deltas.md; encode and apply time not modelled)\n",
                  100 * o.changed_fraction, 100 * wire / static_cast<double>(o.model_bytes));
    os << line;
  }
  os << "one replica alone: "
     << Seconds(wire / BytesPerSecond(std::min(o.trainer_gbps, o.replica_gbps))) << "\n";
  char line[200];
  std::snprintf(line, sizeof(line), "%-8s %8s %7s %16s %12s %12s %12s\n", "topology", "fan-out",
                "depth", "trainer egress", "stream", "pipeline", "all hold it");
  os << line;
  for (const FanoutPrediction& p : rows) {
    std::snprintf(line, sizeof(line), "%-8s %8llu %7u %16s %12s %12s %12s\n",
                  TopologyName(p.topology), static_cast<unsigned long long>(p.fanout), p.depth,
                  DecimalBytes(static_cast<uint64_t>(p.trainer_egress_bytes)).c_str(),
                  Seconds(p.stream_seconds).c_str(), Seconds(p.pipeline_seconds).c_str(),
                  Seconds(p.seconds()).c_str());
    os << line;
  }
  os << "A lower bound from link speeds (full duplex, no congestion or failures), not a "
        "measurement.\n"
     << (o.store_and_forward
             ? "Store-and-forward: what relays do for steps that come as deltas "
               "(docs/relays.md).\n"
             : "Cut-through: relays forward a bucket while they receive the next, as they do for "
               "whole steps over\ntcp (docs/relays.md); --store-and-forward for steps that come "
               "as deltas.\n");
  return os.str();
}

}  // namespace weightsync::tools
