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
  // A source that publishes a destination with a matching (or, with conversion on, convertible)
  // dtype and the same shape.
  struct Holder {
    uint32_t source;
    uint64_t bytes;  // what it sends for the tensor (what crosses its link)
    bool exact;      // same dtype: no conversion
  };
  std::vector<std::vector<Holder>> holders(destinations.size());
  std::vector<bool> refused(destinations.size(), false);  // listed once already
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
      if (destinations[it->second].quantization.format != Quantization::Format::kNone) {
        if (!refused[it->second]) {  // once, not once per publisher holding it
          mismatches.Add("tensor '", p.spec.name,
                         "': block-scaled quantization (MXFP8, NVFP4) from several publishers is "
                         "not supported yet; one publisher must hold the whole tensor");
        }
        refused[it->second] = true;
        continue;
      }
      bool same = true;
      const bool converts =
          convert.enabled && TransformFor(p.spec.dtype, dst.dtype) != Transform::kCopy;
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
      if (same) holders[it->second].push_back({s, p.spec.nbytes, p.spec.dtype == dst.dtype});
    }
  }
  std::string all_names;
  for (const auto& s : sources) all_names += (all_names.empty() ? "" : ", ") + s.name;
  // An fp8 scale destination nobody publishes follows its tensor (resolved after assignment).
  std::vector<uint32_t> scale_base(destinations.size(), kNoDestination);
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    const std::string& name = destinations[d].spec.name;
    const std::string& suffix = convert.scale_suffix;
    if (!convert.enabled || !holders[d].empty() || suffix.empty() || name.size() <= suffix.size() ||
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
    if (destinations[d].alias_of != kNoDestination) continue;  // goes with the tensor it aliases
    if (refused[d]) continue;
    if (holders[d].empty() && scale_base[d] == kNoDestination) {
      bool reported = false;  // a holder with the wrong dtype/shape was already listed above
      for (const auto& s : sources) {
        for (const auto& p : s.welcome->tensors)
          reported |= p.spec.name == destinations[d].spec.name;
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
  for (std::vector<Holder>& h : holders) {
    if (std::any_of(h.begin(), h.end(), [](const Holder& x) { return x.exact; })) {
      std::erase_if(h, [](const Holder& x) { return !x.exact; });
    }
  }

  Schedule schedule;
  schedule.destinations.resize(sources.size());
  schedule.bytes.assign(sources.size(), 0);
  std::vector<uint32_t> source_of(destinations.size(), kNoDestination);
  auto assign = [&](uint32_t d, const Holder& h) {
    schedule.destinations[h.source].push_back(d);
    schedule.bytes[h.source] += h.bytes;
    source_of[d] = h.source;
  };
  std::vector<uint32_t> shared;  // destinations with a choice of source
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    if (destinations[d].alias_of != kNoDestination) continue;  // placed below
    if (holders[d].size() == 1) assign(d, holders[d][0]);
    if (holders[d].size() > 1) shared.push_back(d);  // none: a scale destination, placed below
  }
  // Largest first, then by registration order: deterministic, and close to balanced.
  std::stable_sort(shared.begin(), shared.end(), [&](uint32_t a, uint32_t b) {
    return destinations[a].spec.nbytes > destinations[b].spec.nbytes;
  });
  for (uint32_t d : shared) {
    // min_element keeps the first of equals: ties go to the publisher listed first.
    assign(d, *std::min_element(holders[d].begin(), holders[d].end(),
                                [&](const Holder& a, const Holder& b) {
                                  return schedule.bytes[a.source] < schedule.bytes[b.source];
                                }));
  }
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    // Computed on the subscriber from its tensor's bytes, so nothing crosses a link for it.
    if (scale_base[d] != kNoDestination)
      schedule.destinations[source_of[scale_base[d]]].push_back(d);
    // Tied to another destination: with it, so the share's plan knows it is covered.
    const uint32_t original = destinations[d].alias_of;
    if (original != kNoDestination && source_of[original] != kNoDestination) {
      schedule.destinations[source_of[original]].push_back(d);
    }
  }
  for (auto& list : schedule.destinations) std::sort(list.begin(), list.end());
  return schedule;
}

}  // namespace weightsync::plan
