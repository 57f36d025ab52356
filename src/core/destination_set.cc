#include "core/destination_set.h"

#include <cstdio>
#include <iterator>
#include <utility>

#include "weightsync/manifest.h"
#include "weightsync/region.h"

namespace weightsync::core {
namespace {

std::string RangeText(const plan::Destination& d) {
  char text[64];
  std::snprintf(text, sizeof(text), "[%#llx, +%llu)",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(d.data)),
                static_cast<unsigned long long>(d.spec.nbytes));
  return text;
}

Status Overlap(const plan::Destination& earlier, const plan::Destination& later) {
  return Status::InvalidArgument(
      "tensor '", later.spec.name, "' overlaps tensor '", earlier.spec.name, "' in ",
      DeviceString(later.device), " memory (", RangeText(later), " and ", RangeText(earlier),
      "): every destination byte is written once per step, so destinations must not share "
      "memory; an exact alias (same address, dtype and shape, e.g. tied weights) is allowed and "
      "written once");
}

}  // namespace

Result<std::vector<RegionPart>> CompleteRegions(const TensorSpec& spec,
                                                const std::vector<RegionPart>& parts) {
  std::vector<RegionPart> out = parts;
  const size_t n = spec.shape.size();
  for (size_t i = 0; i < out.size(); ++i) {
    RegionPart& part = out[i];
    auto problem = [&](auto&&... what) {
      return Status::InvalidArgument("tensor '", spec.name, "' region part ", i, " (",
                                     RegionPartString(part), "): ", what...);
    };
    if (part.tensor.empty()) part.tensor = spec.name;
    if (part.tensor.size() > kMaxNameBytes) {
      return problem("global name longer than ", kMaxNameBytes, " bytes");
    }
    if (part.extent.empty()) {
      if (out.size() > 1) return problem("no extent: only a single part may leave it out");
      part.extent = spec.shape;
    }
    if (part.at.empty()) part.at.assign(n, 0);
    if (part.global_shape.size() != n || part.offset.size() != n || part.extent.size() != n ||
        part.at.size() != n) {
      return problem("global_shape, offset, extent and at need ", n, " dims each (the tensor's ",
                     ShapeString(spec.shape), "); got ", part.global_shape.size(), ", ",
                     part.offset.size(), ", ", part.extent.size(), " and ", part.at.size());
    }
    for (size_t d = 0; d < n; ++d) {
      if (part.offset[d] < 0 || part.extent[d] < 0 || part.at[d] < 0 || part.global_shape[d] < 0 ||
          part.offset[d] > part.global_shape[d] - part.extent[d] ||
          part.at[d] > spec.shape[d] - part.extent[d]) {
        return problem("dim ", d, " does not fit: offset ", part.offset[d], " + extent ",
                       part.extent[d], " within global ", part.global_shape[d], ", at ", part.at[d],
                       " + extent within the tensor's ", spec.shape[d]);
      }
    }
  }
  return out;
}

size_t DestinationSet::written_count() const {
  size_t n = 0;
  for (const plan::Destination& d : destinations_) n += d.alias_of == plan::kNoDestination;
  return n;
}

DestinationSet::RangeKey DestinationSet::KeyOf(const plan::Destination& d) {
  return {static_cast<int>(d.device.kind), d.device.index, reinterpret_cast<uintptr_t>(d.data)};
}

Status DestinationSet::IndexRanges(size_t first) {
  std::vector<RangeKey> inserted;
  auto undo = [&](Status s) {
    for (const RangeKey& key : inserted) ranges_.erase(key);
    return s;
  };
  for (size_t i = first; i < destinations_.size(); ++i) {
    plan::Destination& d = destinations_[i];
    d.alias_of = plan::kNoDestination;
    if (d.spec.nbytes == 0) continue;  // no bytes, nothing to share
    const RangeKey key = KeyOf(d);
    const uintptr_t start = std::get<2>(key);
    auto same_device = [&](const RangeKey& other) {
      return std::get<0>(other) == std::get<0>(key) && std::get<1>(other) == std::get<1>(key);
    };
    auto next = ranges_.lower_bound(key);
    if (next != ranges_.end() && next->first == key) {
      const plan::Destination& original = destinations_[next->second];
      if (original.spec.nbytes == d.spec.nbytes && original.spec.dtype == d.spec.dtype &&
          original.spec.shape == d.spec.shape && original.regions == d.regions &&
          original.quantization == d.quantization) {
        d.alias_of = next->second;
        continue;
      }
      return undo(Overlap(original, d));
    }
    if (next != ranges_.end() && same_device(next->first) &&
        std::get<2>(next->first) - start < d.spec.nbytes) {
      return undo(Overlap(destinations_[next->second], d));
    }
    if (next != ranges_.begin()) {
      auto before = std::prev(next);
      const plan::Destination& b = destinations_[before->second];
      if (same_device(before->first) && start - std::get<2>(before->first) < b.spec.nbytes) {
        return undo(Overlap(b, d));
      }
    }
    ranges_.emplace(key, static_cast<uint32_t>(i));
    inserted.push_back(key);
  }
  return Status::Ok();
}

Status DestinationSet::Add(const std::vector<NamedTensor>& tensors) {
  // Specs checked on their own (names, dims, sizes, duplicates within the call): O(new tensors).
  WS_ASSIGN_OR_RETURN(Manifest m, Manifest::FromTensors(tensors));
  std::vector<plan::Destination> added;
  added.reserve(tensors.size());
  bool replaces = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& spec = m.tensors()[i];
    if (tensors[i].view.data == nullptr && spec.nbytes > 0) {
      return Status::InvalidArgument("tensor '", spec.name, "': null data pointer");
    }
    replaces = replaces || by_name_.count(spec.name) > 0;
    added.push_back({spec, static_cast<uint8_t*>(tensors[i].view.data), tensors[i].view.device});
    WS_ASSIGN_OR_RETURN(added.back().regions, CompleteRegions(spec, tensors[i].regions));
    added.back().quantization = tensors[i].quantization;
    if (tensors[i].quantization.format != Quantization::Format::kNone &&
        !tensors[i].regions.empty()) {
      return Status::InvalidArgument(
          "tensor '", spec.name,
          "': block-scaled quantization (MXFP8, NVFP4) of a destination filled by regions is not "
          "supported yet; register it whole");
    }
  }
  if (destinations_.size() + added.size() > kMaxTensors) {
    return Status::InvalidArgument("registering ", added.size(), " tensors after ",
                                   destinations_.size(), " exceeds the limit of ", kMaxTensors);
  }
  if (replaces) {
    std::vector<plan::Destination> all = destinations_;
    for (plan::Destination& d : added) {
      auto it = by_name_.find(d.spec.name);
      if (it != by_name_.end()) {
        all[it->second] = std::move(d);
      } else {
        all.push_back(std::move(d));
      }
    }
    return Rebuild(std::move(all));
  }
  const size_t first = destinations_.size();
  for (plan::Destination& d : added) destinations_.push_back(std::move(d));
  if (Status s = IndexRanges(first); !s.ok()) {
    destinations_.resize(first);
    return s;
  }
  for (size_t i = first; i < destinations_.size(); ++i) {
    by_name_.emplace(destinations_[i].spec.name, static_cast<uint32_t>(i));
    if (destinations_[i].device.is_cuda()) ++cuda_count_;
  }
  return Status::Ok();
}

Status DestinationSet::Remove(const std::vector<std::string>& names) {
  std::string missing;
  std::vector<bool> removed(destinations_.size(), false);
  for (const std::string& name : names) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      missing += (missing.empty() ? "'" : ", '") + name + "'";
    } else {
      removed[it->second] = true;
    }
  }
  if (!missing.empty()) {
    return Status::NotFound("unregister: not registered: ", missing, " (nothing was removed)");
  }
  std::vector<plan::Destination> kept;
  kept.reserve(destinations_.size());
  for (size_t i = 0; i < destinations_.size(); ++i) {
    if (!removed[i]) kept.push_back(destinations_[i]);
  }
  return Rebuild(std::move(kept));
}

Status DestinationSet::Rebuild(std::vector<plan::Destination> all) {
  std::vector<plan::Destination> old_destinations = std::move(destinations_);
  std::map<RangeKey, uint32_t> old_ranges = std::move(ranges_);
  destinations_ = std::move(all);
  ranges_.clear();
  if (Status s = IndexRanges(0); !s.ok()) {
    destinations_ = std::move(old_destinations);
    ranges_ = std::move(old_ranges);
    return s;
  }
  by_name_.clear();
  cuda_count_ = 0;
  for (size_t i = 0; i < destinations_.size(); ++i) {
    by_name_.emplace(destinations_[i].spec.name, static_cast<uint32_t>(i));
    if (destinations_[i].device.is_cuda()) ++cuda_count_;
  }
  return Status::Ok();
}

}  // namespace weightsync::core
