#include "weightsync/manifest.h"

#include <sstream>
#include <unordered_set>

namespace weightsync {

Result<Manifest> Manifest::Build(std::vector<TensorSpec> specs) {
  std::vector<std::string> problems;
  if (specs.size() > kMaxTensors) {
    return Status::InvalidArgument("manifest: ", specs.size(), " tensors exceed the limit of ",
                                   kMaxTensors);
  }
  std::unordered_set<std::string> seen;
  Manifest m;
  for (size_t i = 0; i < specs.size(); ++i) {
    TensorSpec& s = specs[i];
    const std::string who = "tensor " + std::to_string(i) + " '" + s.name + "'";
    if (s.name.empty()) problems.push_back("tensor " + std::to_string(i) + ": empty name");
    if (s.name.size() > kMaxNameBytes) {
      problems.push_back("tensor " + std::to_string(i) + ": name of " +
                         std::to_string(s.name.size()) + " bytes exceeds " +
                         std::to_string(kMaxNameBytes));
    }
    if (!s.name.empty() && !seen.insert(s.name).second) {
      problems.push_back(who + ": duplicate name");
    }
    if (!IsValidDType(static_cast<uint8_t>(s.dtype))) {
      problems.push_back(who + ": unknown dtype code " +
                         std::to_string(static_cast<int>(s.dtype)));
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
    if (__builtin_add_overflow(m.total_bytes_, s.nbytes, &m.total_bytes_)) {
      problems.push_back(who + ": total manifest bytes overflow");
    }
  }
  if (!problems.empty()) {
    std::ostringstream os;
    os << "manifest: " << problems.size() << " problem(s):";
    for (const auto& p : problems) os << "\n  " << p;
    return Status::InvalidArgument(os.str());
  }
  m.tensors_ = std::move(specs);
  return m;
}

Result<Manifest> Manifest::FromTensors(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.view.dtype, t.view.shape, 0});
  return Build(std::move(specs));
}

int64_t Manifest::Find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace weightsync
