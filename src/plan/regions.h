// Regions: sharded trainers into sharded engines. A publisher may hold a *region* of a global
// tensor (an FSDP dim-0 shard, a TP column or row shard, a range of stacked experts), and a
// subscriber's destination may want a region too, or be *fused* from several (vLLM's qkv_proj =
// rows of q, k and v; gate_up_proj = rows of gate and up). ScheduleRegions intersects what the
// publishers hold with what one subscriber wants: every destination byte comes exactly once, from
// the least-loaded holder, as strided copies computed once (a handle's index tables); one error
// lists every problem (uncovered and doubly-claimed ranges, disagreeing shapes and dtypes).
//
// Coordinates are elements, row-major. A Box is a hyper-rectangle [offset, offset + extent) of a
// global tensor. A copy is `rows` runs of `run_bytes`, each advancing by its pitch on both sides:
// a dim-0 cut is one run, a dim-1 (row-parallel) cut one run per row, deeper cuts several copies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::plan {

struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> extent;
  uint64_t elements() const;
};
// "[0:1792, 0:3584]"
std::string BoxString(const Box& box);

// What one publisher holds of a global tensor.
struct HeldTensor {
  uint32_t source = 0;  // publisher index
  std::string name;     // the global tensor's name
  DType dtype = DType::kUInt8;
  std::vector<int64_t> global_shape;
  Box box;  // where the held tensor sits; its shape is box.extent
};

// Part of a destination: the region `box` of global tensor `name`, written at `at` (per dim) of
// destination `destination`. A whole tensor is one piece covering it; a fused one several.
struct WantedPiece {
  uint32_t destination = 0;
  std::string name;
  std::vector<int64_t> global_shape;
  Box box;
  std::vector<int64_t> at;
};

struct DestinationShape {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  // False: written through another destination (tied weights), so it wants no pieces itself.
  bool written = true;
};

// rows × run_bytes: row r reads held tensor `held` at src_offset + r * src_pitch and writes
// destination `destination` at dst_offset + r * dst_pitch. Offsets and pitches are bytes of their
// own side; a copy that casts (the held tensor's dtype is not the destination's) writes
// dst_run_bytes per row (the same elements in the destination's dtype), otherwise run_bytes.
struct RegionCopy {
  uint32_t held = 0;  // index into the HeldTensor list
  uint32_t destination = 0;
  uint64_t src_offset = 0;
  uint64_t src_pitch = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_pitch = 0;
  uint64_t run_bytes = 0;
  uint64_t rows = 0;
  uint64_t dst_run_bytes = 0;                          // 0: run_bytes (no cast)
  uint64_t bytes() const { return run_bytes * rows; }  // bytes read (moved)
  uint64_t written_run_bytes() const { return dst_run_bytes != 0 ? dst_run_bytes : run_bytes; }
};

struct RegionSchedule {
  std::vector<RegionCopy> copies;          // in wanted-piece order
  std::vector<uint64_t> bytes_per_source;  // what each publisher sends this subscriber
  uint64_t total_bytes = 0;
};

// `sources`: how many publishers (held[i].source < sources). `rotation`: where ties between
// equally loaded holders start (e.g. the subscriber's rank), so subscribers planning on their own
// spread replicated regions over the holders. `load` (optional, one per source): bytes already
// assigned to each publisher by other subscribers, added to and used for balancing.
// `casts`: a holder whose dtype differs from the destination's is usable when the difference is
// a cast among float32, float16 and bfloat16 (SubscriberOptions::convert_dtypes); the copies then
// convert (RegionCopy::dst_run_bytes). Any other difference is a listed problem.
Result<RegionSchedule> ScheduleRegions(const std::vector<HeldTensor>& held,
                                       const std::vector<DestinationShape>& destinations,
                                       const std::vector<WantedPiece>& wanted, uint32_t sources,
                                       uint32_t rotation = 0, std::vector<uint64_t>* load = nullptr,
                                       bool casts = false);

// The publishers' side of ScheduleRegions, checked and indexed by tensor name once, for planning
// many subscribers against the same publishers (`weightsync plan-sim` plans every engine rank of a
// cluster): ScheduleRegions(regions, ...) returns exactly what ScheduleRegions(held, ..., sources,
// ...) returns, without re-indexing `held` on every call. Points into `held`, which must outlive
// it unchanged.
class HeldRegions {
 public:
  HeldRegions(const std::vector<HeldTensor>& held, uint32_t sources);
  const std::vector<HeldTensor>& held() const { return *held_; }
  uint32_t sources() const { return sources_; }
  // The usable held tensors of one name, in held() order.
  struct Holders {
    std::vector<uint32_t> index;  // into held()
    // True when every one has the global shape and dtype of held()[index[0]]; then `boxes` holds
    // their boxes side by side (offset then extent, `rank` values each) for the overlap scans.
    bool uniform = true;
    size_t rank = 0;
    std::vector<int64_t> boxes;
  };
  const Holders* HoldersOf(std::string_view name) const;  // nullptr if none
  // One line per held tensor that cannot be used (source out of range, box outside its shape).
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  const std::vector<HeldTensor>* held_;
  uint32_t sources_;
  std::vector<std::string> problems_;
  std::unordered_map<std::string_view, Holders> by_name_;
};
Result<RegionSchedule> ScheduleRegions(const HeldRegions& held,
                                       const std::vector<DestinationShape>& destinations,
                                       const std::vector<WantedPiece>& wanted,
                                       uint32_t rotation = 0, std::vector<uint64_t>* load = nullptr,
                                       bool casts = false);

// Fused destinations, as engines lay them out: `parts` of global tensors (each a region of its
// global tensor) concatenated along `dim` of a destination, in order. E.g. a TP-2 engine's
// qkv_proj on rank 1 = q rows [1792, 3584) ++ k rows [256, 512) ++ v rows [256, 512).
struct FusedPart {
  std::string name;
  std::vector<int64_t> global_shape;
  Box box;
};
std::vector<WantedPiece> Fused(uint32_t destination, int dim, const std::vector<FusedPart>& parts);
// The region of `global_shape` a rank holds when it is split evenly in `parts` along `dim`
// (FSDP and TP column shards: dim 0; TP row shards: dim 1; stacked experts: dim 0).
Box EvenShard(const std::vector<int64_t>& global_shape, int dim, int parts, int rank);

}  // namespace weightsync::plan
