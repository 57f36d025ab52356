#include "plan/published_manifest.h"

#include "plan/plan.h"

namespace weightsync::plan {

Status PublishedManifest::Add(const wire::Welcome& welcome, std::string_view source) {
  const std::vector<int64_t> aliases = PublishedAliases(welcome);
  std::vector<TensorSpec> added;
  added.reserve(welcome.tensors.size());
  std::unordered_map<std::string_view, size_t> added_at;  // this publisher's new names
  for (size_t i = 0; i < welcome.tensors.size(); ++i) {
    const wire::TensorPlacement& p = welcome.tensors[i];
    TensorSpec spec = p.spec;
    if (p.sharded) {
      spec = {p.shard.tensor, p.spec.dtype, p.shard.global_shape, 0};
      Result<uint64_t> bytes = TensorView{nullptr, spec.dtype, spec.shape}.NumBytes();
      if (!bytes.ok()) {
        return Status::ProtocolError("tensor '", p.spec.name, "' is a shard of '", spec.name,
                                     "', whose global shape ", ShapeString(spec.shape),
                                     " has no byte size");
      }
      spec.nbytes = *bytes;
    } else if (aliases[i] >= 0) {
      spec.alias_of = welcome.tensors[aliases[i]].spec.name;
    }
    // Listed already (several publishers, or several shards of one global tensor): the first
    // listing stands, and must agree.
    const TensorSpec* seen = nullptr;
    std::string_view seen_from = source;
    if (auto it = index_.find(spec.name); it != index_.end()) {
      seen = &specs_[it->second];
      seen_from = from_[it->second];
    } else if (auto at = added_at.find(spec.name); at != added_at.end()) {
      seen = &added[at->second];
    }
    if (seen != nullptr) {
      if (seen->dtype != spec.dtype || seen->shape != spec.shape) {
        return Status::InvalidArgument("tensor '", spec.name, "': ", seen_from, " publishes ",
                                       DTypeName(seen->dtype), " ", ShapeString(seen->shape), ", ",
                                       source, " publishes ", DTypeName(spec.dtype), " ",
                                       ShapeString(spec.shape));
      }
      continue;
    }
    if (!spec.alias_of.empty()) {
      // Name the original as the listing has it: an earlier publisher may list it as an alias.
      if (auto it = index_.find(spec.alias_of); it != index_.end()) {
        if (!specs_[it->second].alias_of.empty()) spec.alias_of = specs_[it->second].alias_of;
      }
    }
    added.push_back(std::move(spec));
    added_at.emplace(added.back().name, added.size() - 1);  // reserved: `added` never moves
  }
  for (TensorSpec& spec : added) {
    index_.emplace(spec.name, specs_.size());
    specs_.push_back(std::move(spec));
    from_.emplace_back(source);
  }
  return Status::Ok();
}

Result<Manifest> PublishedManifest::Finish() && { return Manifest::Build(std::move(specs_)); }

}  // namespace weightsync::plan
