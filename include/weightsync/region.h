// Regions: sharded trainers into sharded engines. A tensor registered on either side may be a
// region of a larger, *global* tensor (NamedTensor::regions):
//  * a publisher holds one region of a global tensor — an FSDP shard (rows of it), a tensor-
//    parallel column or row slice, a range of stacked experts — and gathers nothing;
//  * a subscriber's destination is filled by one or more regions of global tensors — its own TP
//    slice, or a fused parameter such as vLLM's qkv_proj (rows of q, k and v) or gate_up_proj.
// At every prepare the subscriber intersects what its publishers hold with what it wants: every
// destination byte comes exactly once, from the least-loaded publisher holding it, and only those
// bytes move. One error lists every byte range nobody holds and every one written twice.
//
// Coordinates are elements of the global tensor, row-major, per dimension. These helpers build the
// usual layouts; docs/regions.md shows the common ones in C++ and Python.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightsync/tensor_view.h"

namespace weightsync {

// Rank `rank` of `parts` even shards of `global_shape` along `dim` (dims of n elements give rank r
// the elements [n·r/parts, n·(r+1)/parts)): FSDP shards and TP column slices cut dim 0, TP row
// slices dim 1, expert-parallel ranks dim 0 of the stacked experts.
RegionPart Shard(const std::string& tensor, const std::vector<int64_t>& global_shape, int dim,
                 int parts, int rank);

// The whole of `tensor`.
RegionPart Whole(const std::string& tensor, const std::vector<int64_t>& global_shape);

// `parts` one after another along `dim` of the registered tensor (fills each part's `at`): a
// fused destination, e.g. Fuse(0, {Shard(q…), Shard(k…), Shard(v…)}) for a TP rank's qkv_proj.
std::vector<RegionPart> Fuse(int dim, std::vector<RegionPart> parts);

// "'q' [896:1792, 0:3584] of [3584, 3584]" for messages.
std::string RegionPartString(const RegionPart& part);

}  // namespace weightsync
