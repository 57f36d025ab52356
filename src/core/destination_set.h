// DestinationSet: the tensors a Subscriber writes, by name, as registered (Subscriber::Register /
// Unregister). Keeps the invariants the transfer handles rely on:
//  - names are unique, specs valid (Manifest's rules);
//  - no two destinations share a byte, so no byte is written twice in a step — except exact
//    aliases (same device, address, dtype and shape: tied weights such as an embedding that is
//    also the output projection), which are accepted and marked (plan::Destination::alias_of) so
//    a step writes them once.
// Adding new names costs O(new · log n) (an engine's allocate() loop of 100k tensors stays
// linear); replacing or removing names rebuilds the set, O(n log n). Every change is
// all-or-nothing: on error the set is as it was.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "plan/plan.h"
#include "weightsync/status.h"
#include "weightsync/tensor_view.h"

namespace weightsync::core {

// `parts` of a registered tensor `spec` with every field filled in (tensor name, a single part's
// extent, at), each checked: dims agree, every part fits its global tensor and the registered
// one. InvalidArgument names the tensor, the part and the problem. Coverage (every element
// exactly once) and agreement with the publishers are checked when the schedule is built.
Result<std::vector<RegionPart>> CompleteRegions(const TensorSpec& spec,
                                                const std::vector<RegionPart>& parts);

class DestinationSet {
 public:
  // Registers `tensors`: new names are appended, names already registered take the new memory
  // (and keep their position).
  Status Add(const std::vector<NamedTensor>& tensors);
  // Removes the named tensors; NotFound lists names that are not registered (nothing removed).
  Status Remove(const std::vector<std::string>& names);

  const std::vector<plan::Destination>& destinations() const { return destinations_; }
  // Destinations an update writes itself (not through a tensor they alias).
  size_t written_count() const;
  bool empty() const { return destinations_.empty(); }
  bool any_cuda() const { return cuda_count_ > 0; }

 private:
  // Where a destination's bytes start: device, then address.
  using RangeKey = std::tuple<int, int, uintptr_t>;
  static RangeKey KeyOf(const plan::Destination& d);
  // Checks destinations_[first..] against the ranges indexed so far and against each other, marks
  // exact aliases, and indexes them. On error the index is as before.
  Status IndexRanges(size_t first);
  Status Rebuild(std::vector<plan::Destination> all);

  std::vector<plan::Destination> destinations_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::map<RangeKey, uint32_t> ranges_;  // start → the destination owning [start, start + nbytes)
  size_t cuda_count_ = 0;
};

}  // namespace weightsync::core
