#include "plan/schedule.h"

#include <algorithm>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include "plan/mismatch_list.h"
#include "weightsync/dtype.h"
#include "weightsync/tensor_view.h"

namespace weightsync::plan {

Result<Schedule> AssignSources(const std::vector<SourceManifest>& sources,
                               const std::vector<Destination>& destinations, MatchPolicy policy,
                               const ConvertOptions& convert) {
  if (sources.empty()) return Status::InvalidArgument("schedule: no publishers to assign from");
  std::unordered_map<std::string_view, uint32_t> by_name;
  by_name.reserve(destinations.size());
  for (uint32_t d = 0; d < destinations.size(); ++d) by_name.emplace(destinations[d].spec.name, d);

  MismatchList mismatches("the publishers' and the subscriber's manifests");
  // holders[d]: the sources that publish destination d with a matching (or, with conversion on,
  // convertible) dtype and the same shape; exact[d]: whether some holder needs no conversion.
  // published[d][k]: the bytes holders[d][k] sends for it (what crosses its link).
  std::vector<std::vector<uint32_t>> holders(destinations.size());
  std::vector<std::vector<uint64_t>> published(destinations.size());
  std::vector<bool> exact(destinations.size(), false);
  std::vector<std::vector<bool>> holder_exact(destinations.size());
  for (uint32_t s = 0; s < sources.size(); ++s) {
    for (const wire::TensorPlacement& p : sources[s].welcome->tensors) {
      auto it = by_name.find(p.spec.name);
      if (it == by_name.end()) {
        if (policy == MatchPolicy::kStrict) {
          mismatches.Add("tensor '", p.spec.name, "': published by ", sources[s].name,
                         " but not registered by subscriber (strict policy)");
        }
        continue;
      }
      const TensorSpec& dst = destinations[it->second].spec;
      bool same = true;
      const bool converts = convert.enabled && TransformFor(p.spec.dtype, dst.dtype) !=
                                                   Transform::kCopy;
      if (p.spec.dtype != dst.dtype && !converts) {
        mismatches.Add("tensor '", p.spec.name, "': dtype mismatch: publisher ", sources[s].name,
                       " ", DTypeName(p.spec.dtype), ", subscriber ", DTypeName(dst.dtype));
        same = false;
      }
      if (p.spec.shape != dst.shape) {
        mismatches.Add("tensor '", p.spec.name, "': shape mismatch: publisher ", sources[s].name,
                       " ", ShapeString(p.spec.shape), ", subscriber ", ShapeString(dst.shape));
        same = false;
      }
      if (same) {
        holders[it->second].push_back(s);
        published[it->second].push_back(p.spec.nbytes);
        holder_exact[it->second].push_back(p.spec.dtype == dst.dtype);
        if (p.spec.dtype == dst.dtype) exact[it->second] = true;
      }
    }
  }
  std::string all_names;
  for (const auto& s : sources) all_names += (all_names.empty() ? "" : ", ") + s.name;
  // An fp8 scale destination nobody publishes follows its tensor (resolved after assignment).
  std::vector<uint32_t> scale_base(destinations.size(), kNoDestination);
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    const std::string& name = destinations[d].spec.name;
    const std::string& suffix = convert.scale_suffix;
    if (!convert.enabled || !holders[d].empty() || suffix.empty() ||
        name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    auto base = by_name.find(std::string_view(name).substr(0, name.size() - suffix.size()));
    if (base != by_name.end() && destinations[base->second].spec.dtype == DType::kFloat8E4M3FN &&
        !holders[base->second].empty()) {
      scale_base[d] = base->second;
    }
  }
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    if (holders[d].empty() && scale_base[d] == kNoDestination) {
      bool reported = false;  // a holder with the wrong dtype/shape was already listed above
      for (const auto& s : sources) {
        for (const auto& p : s.welcome->tensors) reported |= p.spec.name == destinations[d].spec.name;
      }
      if (!reported) {
        mismatches.Add("tensor '", destinations[d].spec.name,
                       "': registered by subscriber but published by none of ", all_names);
      }
    }
  }
  if (!mismatches.empty()) return mismatches.ToStatus();

  // A replica that needs no conversion wins over one that would convert: the two would need
  // different companions (an fp8 publisher sends its own scales; a bf16 one has them computed).
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    if (!exact[d] || holders[d].size() < 2) continue;
    std::vector<uint32_t> kept;
    std::vector<uint64_t> kept_bytes;
    for (size_t k = 0; k < holders[d].size(); ++k) {
      if (!holder_exact[d][k]) continue;
      kept.push_back(holders[d][k]);
      kept_bytes.push_back(published[d][k]);
    }
    holders[d] = std::move(kept);
    published[d] = std::move(kept_bytes);
  }

  Schedule schedule;
  schedule.destinations.resize(sources.size());
  schedule.bytes.assign(sources.size(), 0);
  std::vector<uint32_t> shared;  // destinations with a choice of source
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    if (holders[d].empty()) continue;  // a scale destination, placed below
    if (holders[d].size() == 1) {
      schedule.destinations[holders[d][0]].push_back(d);
      schedule.bytes[holders[d][0]] += published[d][0];
    } else {
      shared.push_back(d);
    }
  }
  // Largest first, then by registration order: deterministic, and close to balanced.
  std::stable_sort(shared.begin(), shared.end(), [&](uint32_t a, uint32_t b) {
    return destinations[a].spec.nbytes > destinations[b].spec.nbytes;
  });
  for (uint32_t d : shared) {
    size_t best = 0;
    for (size_t k = 1; k < holders[d].size(); ++k) {
      if (schedule.bytes[holders[d][k]] < schedule.bytes[holders[d][best]]) best = k;
    }
    schedule.destinations[holders[d][best]].push_back(d);
    schedule.bytes[holders[d][best]] += published[d][best];
  }
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    if (scale_base[d] == kNoDestination) continue;
    for (size_t s = 0; s < sources.size(); ++s) {
      auto& list = schedule.destinations[s];
      if (std::find(list.begin(), list.end(), scale_base[d]) != list.end()) {
        list.push_back(d);  // computed on the subscriber, so no bytes on the link
        break;
      }
    }
  }
  for (auto& list : schedule.destinations) std::sort(list.begin(), list.end());
  return schedule;
}

}  // namespace weightsync::plan
