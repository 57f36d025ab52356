// The fan-out model behind `weightsync fanout-sim` (issue 42, docs/plan_sim.md "Fan-out to
// replicas"): how long until every one of N inference replicas holds a step, when the trainer
// sends it to each replica itself (direct), or the replicas relay it along a tree of bounded
// fan-out or a chain, forwarding each bucket while they receive the next (cut-through), or — as
// the relays built today do (docs/relays.md) — each whole step once they committed it
// (store-and-forward).
//
// A lower bound from link speeds, like plan-sim: full-duplex links, each sender's egress shared
// evenly by its children, no congestion, no latency besides the buckets (or whole steps) a relay
// must receive before forwarding them, no failures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightsync/status.h"

namespace weightsync::tools {

struct FanoutOptions {
  uint64_t replicas = 1000;
  uint64_t model_bytes = 0;  // what one replica holds
  uint32_t element_bytes = 2;
  // ≥ 0: each step sends deltas of this fraction of changed elements (the kAuto publisher's wire
  // bytes, delta::ExpectedWireBytesPerElement); < 0: the whole model.
  double changed_fraction = -1;
  double trainer_gbps = 400;            // the trainer's egress, Gb/s
  double replica_gbps = 400;            // each replica's NIC, per direction, Gb/s
  uint64_t bucket_bytes = 64ull << 20;  // what a relay receives before it forwards
  // A relay forwards a step only once it holds all of it (what relays do for a step that comes as
  // deltas; a whole step over tcp they cut through): each level below the first waits for its
  // parent's whole transfer instead of one bucket.
  bool store_and_forward = false;
};

enum class Topology : uint8_t { kDirect, kTree, kChain };
const char* TopologyName(Topology t);  // "direct", "tree", "chain"

struct FanoutPrediction {
  Topology topology = Topology::kDirect;
  uint64_t fanout = 0;  // children per sender (direct: every replica)
  uint32_t depth = 0;   // levels of replicas below the trainer
  double trainer_egress_bytes = 0;
  double stream_seconds = 0;    // the busiest sender's (or receiver's) bytes at its link speed
  double pipeline_seconds = 0;  // the buckets each level below the first waits for
  double seconds() const { return stream_seconds + pipeline_seconds; }
};

// The bytes one replica receives per step (the whole model, or its deltas).
double WireBytes(const FanoutOptions& o);
// Direct; a tree for each fan-out in `fanouts` (each ≥ 2); a chain. InvalidArgument names a bad
// option (no replicas, no model, a speed ≤ 0, a fan-out < 2, a fraction outside [0, 1]).
Result<std::vector<FanoutPrediction>> PredictFanout(const FanoutOptions& o,
                                                    const std::vector<uint64_t>& fanouts);
// The table `weightsync fanout-sim` prints.
std::string FormatFanout(const FanoutOptions& o, const std::vector<FanoutPrediction>& rows);

}  // namespace weightsync::tools
