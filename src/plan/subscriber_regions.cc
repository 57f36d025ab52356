#include "plan/subscriber_regions.h"

#include <string_view>
#include <unordered_map>
#include <utility>

#include "plan/mismatch_list.h"

namespace weightsync::plan {

bool UsesRegions(std::span<const wire::Welcome* const> welcomes,
                 const std::vector<Destination>& destinations) {
  for (const Destination& d : destinations) {
    if (!d.regions.empty()) return true;
  }
  for (const wire::Welcome* welcome : welcomes) {
    for (const wire::TensorPlacement& p : welcome->tensors) {
      if (p.sharded) return true;
    }
  }
  return false;
}

Result<SourceShares> ScheduleSubscriberRegions(std::span<const wire::Welcome* const> welcomes,
                                               const std::vector<Destination>& destinations,
                                               MatchPolicy policy, bool casts) {
  std::vector<HeldTensor> held;
  std::vector<std::pair<uint32_t, uint32_t>> held_at;    // (source, index into its Welcome)
  std::unordered_map<std::string_view, bool> published;  // global name → wanted by something
  for (uint32_t s = 0; s < welcomes.size(); ++s) {
    const wire::Welcome& welcome = *welcomes[s];
    for (uint32_t i = 0; i < welcome.tensors.size(); ++i) {
      const wire::TensorPlacement& p = welcome.tensors[i];
      HeldTensor h;
      h.source = s;
      h.name = p.sharded ? p.shard.tensor : p.spec.name;
      h.dtype = p.spec.dtype;
      h.global_shape = p.sharded ? p.shard.global_shape : p.spec.shape;
      h.box.offset = p.sharded ? p.shard.offset : std::vector<int64_t>(p.spec.shape.size(), 0);
      h.box.extent = p.spec.shape;
      published.emplace(p.sharded ? p.shard.tensor : p.spec.name, false);
      held.push_back(std::move(h));
      held_at.emplace_back(s, i);
    }
  }
  std::vector<DestinationShape> shapes;
  std::vector<WantedPiece> wanted;
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    const Destination& dst = destinations[d];
    shapes.push_back(
        {dst.spec.name, dst.spec.dtype, dst.spec.shape, dst.alias_of == kNoDestination});
    const std::vector<int64_t> origin(dst.spec.shape.size(), 0);
    if (dst.alias_of != kNoDestination) {  // written through the tensor it aliases
      if (auto it = published.find(dst.spec.name); it != published.end()) it->second = true;
      continue;
    }
    if (dst.regions.empty()) {
      wanted.push_back({d, dst.spec.name, dst.spec.shape, {origin, dst.spec.shape}, origin});
    }
    for (const RegionPart& part : dst.regions) {  // completed by DestinationSet::Add
      wanted.push_back({d, part.tensor, part.global_shape, {part.offset, part.extent}, part.at});
    }
  }
  for (const WantedPiece& piece : wanted) {
    if (auto it = published.find(piece.name); it != published.end()) it->second = true;
  }
  MismatchList unwanted("the publishers' tensors and the subscriber's (strict policy)");
  if (policy == MatchPolicy::kStrict) {
    for (const auto& [name, is_wanted] : published) {
      if (!is_wanted) unwanted.Add("tensor '", name, "': published but wanted by no destination");
    }
  }
  Result<RegionSchedule> schedule =
      ScheduleRegions(held, shapes, wanted, static_cast<uint32_t>(welcomes.size()),
                      /*rotation=*/0, /*load=*/nullptr, casts);
  if (!unwanted.empty()) {
    Status s = unwanted.ToStatus();
    return schedule.ok() ? s : Status(s.code(), s.message() + "\n" + schedule.status().message());
  }
  WS_RETURN_IF_ERROR(schedule.status());
  SourceShares shares;
  shares.copies.resize(welcomes.size());
  shares.bytes = schedule->bytes_per_source;
  shares.total_copies = schedule->copies.size();
  for (RegionCopy copy : schedule->copies) {
    const auto [s, index] = held_at[copy.held];
    copy.held = index;
    shares.copies[s].push_back(copy);
  }
  return shares;
}

}  // namespace weightsync::plan
