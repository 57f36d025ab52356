#include "weightsync/region.h"

#include <utility>

namespace weightsync {

RegionPart Shard(const std::string& tensor, const std::vector<int64_t>& global_shape, int dim,
                 int parts, int rank) {
  RegionPart part = Whole(tensor, global_shape);
  // An out-of-range dim or count is left whole: registering it names the problem.
  if (dim < 0 || static_cast<size_t>(dim) >= global_shape.size() || parts <= 0) return part;
  const int64_t n = global_shape[dim];
  const int64_t lo = n * rank / parts, hi = n * (rank + 1) / parts;
  part.offset[dim] = lo;
  part.extent[dim] = hi - lo;
  return part;
}

RegionPart Whole(const std::string& tensor, const std::vector<int64_t>& global_shape) {
  return {tensor, global_shape, std::vector<int64_t>(global_shape.size(), 0), global_shape, {}};
}

std::vector<RegionPart> Fuse(int dim, std::vector<RegionPart> parts) {
  int64_t at = 0;
  for (RegionPart& part : parts) {
    part.at.assign(part.global_shape.size(), 0);
    if (dim < 0 || static_cast<size_t>(dim) >= part.at.size() ||
        part.extent.size() != part.at.size()) {
      continue;  // registering it names the problem
    }
    part.at[dim] = at;
    at += part.extent[dim];
  }
  return parts;
}

std::string RegionPartString(const RegionPart& part) {
  std::string out = "'" + part.tensor + "' [";
  for (size_t d = 0; d < part.offset.size(); ++d) {
    if (d > 0) out += ", ";
    const int64_t extent = d < part.extent.size() ? part.extent[d] : 0;
    out += std::to_string(part.offset[d]) + ":" + std::to_string(part.offset[d] + extent);
  }
  return out + "] of " + ShapeString(part.global_shape);
}

}  // namespace weightsync
