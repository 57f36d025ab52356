#include "weightsync/manifest.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace weightsync {

Result<Manifest> Manifest::Build(std::vector<TensorSpec> specs) {
  Manifest m;
  WS_RETURN_IF_ERROR(m.Append(std::move(specs)));
  return m;
}

Status Manifest::Append(std::vector<TensorSpec> specs) {
  std::vector<std::string> problems;
  const size_t base = tensors_.size();
  if (specs.size() > kMaxTensors - std::min<size_t>(base, kMaxTensors)) {
    return Status::InvalidArgument("manifest: ", base + specs.size(),
                                   " tensors exceed the limit of ", kMaxTensors);
  }
  std::unordered_set<std::string_view> seen;  // names of this call
  seen.reserve(specs.size());
  // Names of this call → index, for aliases (built only when one is asked for: most manifests
  // have none, and a 10^6-tensor Register should not pay for a second map).
  std::unordered_map<std::string_view, size_t> earlier;
  const bool any_alias = std::any_of(specs.begin(), specs.end(),
                                     [](const TensorSpec& t) { return !t.alias_of.empty(); });
  uint64_t total = total_bytes_;
  for (size_t i = 0; i < specs.size(); ++i) {
    TensorSpec& s = specs[i];
    const std::string who = "tensor " + std::to_string(base + i) + " '" + s.name + "'";
    if (s.name.empty()) problems.push_back("tensor " + std::to_string(base + i) + ": empty name");
    if (s.name.size() > kMaxNameBytes) {
      problems.push_back("tensor " + std::to_string(base + i) + ": name of " +
                         std::to_string(s.name.size()) + " bytes exceeds " +
                         std::to_string(kMaxNameBytes));
    }
    if (!s.alias_of.empty()) {
      const TensorSpec* original = nullptr;
      if (auto it = earlier.find(s.alias_of); it != earlier.end()) {
        original = &specs[it->second];
      } else if (auto at = index_.find(s.alias_of); at != index_.end()) {
        original = &tensors_[at->second];
      }
      if (original == nullptr) {
        problems.push_back(who + ": an alias of '" + s.alias_of + "', which is no earlier tensor");
      } else if (!original->alias_of.empty()) {
        problems.push_back(who + ": an alias of '" + s.alias_of + "', itself an alias of '" +
                           original->alias_of + "' (name the original)");
      } else if (original->dtype != s.dtype || original->shape != s.shape) {
        problems.push_back(who + ": an alias of '" + s.alias_of + "' (" +
                           std::string(DTypeName(original->dtype)) + " " +
                           ShapeString(original->shape) + ") must have its dtype and shape, not " +
                           std::string(DTypeName(s.dtype)) + " " + ShapeString(s.shape));
      }
    }
    if (!s.name.empty() && (!seen.insert(s.name).second || index_.count(s.name) > 0)) {
      problems.push_back(who + ": duplicate name");
    }
    if (any_alias) earlier.emplace(s.name, i);
    if (!IsValidDType(static_cast<uint8_t>(s.dtype))) {
      problems.push_back(who + ": unknown dtype code " + std::to_string(static_cast<int>(s.dtype)));
      continue;
    }
    if (s.shape.size() > kMaxDims) {
      problems.push_back(who + ": " + std::to_string(s.shape.size()) + " dims exceed " +
                         std::to_string(kMaxDims));
      continue;
    }
    TensorView v{nullptr, s.dtype, s.shape};
    Result<uint64_t> bytes = v.NumBytes();
    if (!bytes.ok()) {
      problems.push_back(who + ": " + bytes.status().message());
      continue;
    }
    s.nbytes = *bytes;
    if (__builtin_add_overflow(total, s.nbytes, &total)) {
      problems.push_back(who + ": total manifest bytes overflow");
    }
  }
  if (!problems.empty()) {
    std::ostringstream os;
    os << "manifest: " << problems.size() << " problem(s):";
    for (const auto& p : problems) os << "\n  " << p;
    return Status::InvalidArgument(os.str());
  }
  // Grown geometrically: reserving exactly base + new per call would copy the whole manifest on
  // every call of a one-tensor-at-a-time loop.
  if (tensors_.capacity() < base + specs.size()) {
    tensors_.reserve(std::max(base + specs.size(), 2 * tensors_.capacity()));
  }
  for (TensorSpec& s : specs) {
    index_.emplace(s.name, static_cast<uint32_t>(tensors_.size()));
    tensors_.push_back(std::move(s));
  }
  total_bytes_ = total;
  return Status::Ok();
}

void Manifest::RemoveLast(size_t count) {
  count = std::min(count, tensors_.size());
  for (size_t i = 0; i < count; ++i) {
    total_bytes_ -= tensors_.back().nbytes;
    index_.erase(tensors_.back().name);
    tensors_.pop_back();
  }
}

Result<Manifest> Manifest::FromTensors(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.view.dtype, t.view.shape, 0});
  return Build(std::move(specs));
}

int64_t Manifest::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
}

}  // namespace weightsync
