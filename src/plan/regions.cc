// Region scheduling. Runs once per transfer handle (and in `weightsync plan-sim` for a whole
// cluster, against publishers indexed once: HeldRegions), so it favours exhaustive checks and
// simple data structures over speed; the hot path only walks the RegionCopy list it produces.
#include "plan/regions.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "plan/mismatch_list.h"
#include "plan/plan.h"
#include "weightsync/region.h"
#include "weightsync/tensor_view.h"

namespace weightsync::plan {
namespace {

bool SameRank(const Box& box, size_t n) { return box.offset.size() == n && box.extent.size() == n; }

std::optional<Box> Intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    if (hi <= lo) return std::nullopt;
    out.offset.push_back(lo);
    out.extent.push_back(hi - lo);
  }
  return out;
}

// Intersect(a, b).has_value() without building the intersection.
bool Overlaps(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    if (hi <= lo) return false;
  }
  return true;
}

// The same for a box packed as `rank` offsets then `rank` extents.
bool Overlaps(const int64_t* packed, size_t rank, const Box& b) {
  for (size_t d = 0; d < rank; ++d) {
    const int64_t lo = std::max(packed[d], b.offset[d]);
    const int64_t hi = std::min(packed[d] + packed[rank + d], b.offset[d] + b.extent[d]);
    if (hi <= lo) return false;
  }
  return true;
}

// Whether the box packed as `rank` offsets then `rank` extents covers `inner`.
bool Covers(const int64_t* outer, size_t rank, const Box& inner) {
  for (size_t d = 0; d < rank; ++d) {
    if (inner.offset[d] < outer[d] ||
        inner.offset[d] + inner.extent[d] > outer[d] + outer[rank + d]) {
      return false;
    }
  }
  return true;
}

bool InShape(const Box& box, const std::vector<int64_t>& at, const std::vector<int64_t>& shape) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.extent[d] < 0 || at[d] < 0 || at[d] + box.extent[d] > shape[d]) return false;
  }
  return true;
}

std::vector<int64_t> Strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  return stride;
}

// The strided copies that move `cell` (global coordinates) from held tensor `h` into the
// destination of piece `p`: the longest contiguous suffix of dimensions forms the run; one
// dimension before it gives the rows; any further outer dimensions give one copy each.
void EmitCopies(const Box& cell, uint32_t held_index, const HeldTensor& h, const WantedPiece& p,
                const std::vector<int64_t>& dst_shape, uint64_t element_bytes,
                uint64_t dst_element_bytes, std::vector<RegionCopy>* out) {
  // A cast writes the same elements at another size: the destination's offsets, pitches and run
  // are in its own element size.
  const bool cast = dst_element_bytes != element_bytes;
  const size_t n = cell.offset.size();
  const std::vector<int64_t>& src_shape = h.box.extent;
  std::vector<int64_t> src_origin(n), dst_origin(n);
  for (size_t d = 0; d < n; ++d) {
    src_origin[d] = cell.offset[d] - h.box.offset[d];
    dst_origin[d] = cell.offset[d] - p.box.offset[d] + p.at[d];
  }
  if (n == 0) {  // a scalar
    out->push_back(
        {held_index, p.destination, 0, 0, 0, 0, element_bytes, 1, cast ? dst_element_bytes : 0});
    return;
  }
  const std::vector<int64_t> src_stride = Strides(src_shape), dst_stride = Strides(dst_shape);
  auto full = [&](size_t d) {
    return cell.extent[d] == src_shape[d] && cell.extent[d] == dst_shape[d];
  };
  size_t k = n - 1;  // dims after k are whole on both sides
  while (k > 0 && full(k)) --k;
  const uint64_t run = static_cast<uint64_t>(cell.extent[k] * src_stride[k]) * element_bytes;
  // Outer index over dims [0, k - 1): one copy each; dim k - 1 (if any) gives the rows.
  const size_t outer = k >= 1 ? k - 1 : 0;
  std::vector<int64_t> index(outer, 0);
  while (true) {
    uint64_t src = 0, dst = 0;
    for (size_t d = 0; d < outer; ++d) {
      src += static_cast<uint64_t>((src_origin[d] + index[d]) * src_stride[d]);
      dst += static_cast<uint64_t>((dst_origin[d] + index[d]) * dst_stride[d]);
    }
    for (size_t d = outer; d <= k; ++d) {
      src += static_cast<uint64_t>(src_origin[d] * src_stride[d]);
      dst += static_cast<uint64_t>(dst_origin[d] * dst_stride[d]);
    }
    RegionCopy c{held_index, p.destination, src * element_bytes, 0, dst * dst_element_bytes, 0, run,
                 1};
    if (cast) c.dst_run_bytes = run / element_bytes * dst_element_bytes;
    if (k >= 1) {
      c.rows = static_cast<uint64_t>(cell.extent[k - 1]);
      c.src_pitch = static_cast<uint64_t>(src_stride[k - 1]) * element_bytes;
      c.dst_pitch = static_cast<uint64_t>(dst_stride[k - 1]) * dst_element_bytes;
    }
    out->push_back(c);
    size_t d = outer;  // odometer over the outer dims
    while (d > 0) {
      --d;
      if (++index[d] < cell.extent[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (outer == 0) return;
  }
}

// The grid of cells a piece splits into at every holder boundary inside it.
// `holders`: boxes packed as `n` offsets then `n` extents.
std::vector<Box> Cells(const Box& piece, const std::vector<const int64_t*>& holders) {
  if (piece.elements() == 0) return {};  // nothing to move
  const size_t n = piece.offset.size();
  std::vector<std::vector<int64_t>> cuts(n);
  for (size_t d = 0; d < n; ++d) {
    const int64_t lo = piece.offset[d], hi = lo + piece.extent[d];
    cuts[d] = {lo, hi};
    for (const int64_t* h : holders) {
      for (int64_t c : {h[d], h[d] + h[n + d]}) {
        if (c > lo && c < hi) cuts[d].push_back(c);
      }
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<Box> cells;
  std::vector<size_t> at(n, 0);
  while (true) {
    Box cell;
    for (size_t d = 0; d < n; ++d) {
      cell.offset.push_back(cuts[d][at[d]]);
      cell.extent.push_back(cuts[d][at[d] + 1] - cuts[d][at[d]]);
    }
    cells.push_back(std::move(cell));
    size_t d = n;
    while (d > 0) {
      --d;
      if (++at[d] + 1 < cuts[d].size()) break;
      at[d] = 0;
      if (d == 0) return cells;
    }
    if (n == 0) return cells;
  }
}

}  // namespace

uint64_t Box::elements() const {
  uint64_t n = 1;
  for (int64_t e : extent) n *= static_cast<uint64_t>(std::max<int64_t>(e, 0));
  return n;
}

std::string BoxString(const Box& box) {
  std::string out = "[";
  for (size_t d = 0; d < box.offset.size(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(box.offset[d]) + ":" + std::to_string(box.offset[d] + box.extent[d]);
  }
  return out + "]";
}

HeldRegions::HeldRegions(const std::vector<HeldTensor>& held, uint32_t sources)
    : held_(&held), sources_(sources) {
  for (uint32_t i = 0; i < held.size(); ++i) {
    const HeldTensor& h = held[i];
    if (h.source >= sources) {
      std::ostringstream line;
      line << "tensor '" << h.name << "': held by publisher " << h.source << " of " << sources;
      problems_.push_back(line.str());
      continue;
    }
    if (!SameRank(h.box, h.global_shape.size()) || !InShape(h.box, h.box.offset, h.global_shape)) {
      std::ostringstream line;
      line << "tensor '" << h.name << "': publisher " << h.source << " holds " << BoxString(h.box)
           << " of global shape " << ShapeString(h.global_shape);
      problems_.push_back(line.str());
      continue;
    }
    Holders& named = by_name_[h.name];
    if (!named.index.empty()) {
      const HeldTensor& first = held[named.index[0]];
      named.uniform =
          named.uniform && h.global_shape == first.global_shape && h.dtype == first.dtype;
    }
    named.index.push_back(i);
  }
  for (auto& [name, named] : by_name_) {
    if (!named.uniform) continue;
    named.rank = held[named.index[0]].global_shape.size();
    named.boxes.reserve(named.index.size() * 2 * named.rank);
    for (uint32_t i : named.index) {
      const Box& box = held[i].box;
      named.boxes.insert(named.boxes.end(), box.offset.begin(), box.offset.end());
      named.boxes.insert(named.boxes.end(), box.extent.begin(), box.extent.end());
    }
  }
}

const HeldRegions::Holders* HeldRegions::HoldersOf(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

Result<RegionSchedule> ScheduleRegions(const std::vector<HeldTensor>& held,
                                       const std::vector<DestinationShape>& destinations,
                                       const std::vector<WantedPiece>& wanted, uint32_t sources,
                                       uint32_t rotation, std::vector<uint64_t>* load, bool casts) {
  return ScheduleRegions(HeldRegions(held, sources), destinations, wanted, rotation, load, casts);
}

Result<RegionSchedule> ScheduleRegions(const HeldRegions& regions,
                                       const std::vector<DestinationShape>& destinations,
                                       const std::vector<WantedPiece>& wanted, uint32_t rotation,
                                       std::vector<uint64_t>* load, bool casts) {
  const std::vector<HeldTensor>& held = regions.held();
  const uint32_t sources = regions.sources();
  MismatchList problems("the publishers' regions and the subscriber's");
  for (const std::string& line : regions.problems()) problems.Add(line);
  std::vector<uint64_t> own_load(sources, 0);
  std::vector<uint64_t>& loads = load != nullptr ? *load : own_load;
  if (loads.size() < sources) loads.resize(sources, 0);

  RegionSchedule schedule;
  schedule.bytes_per_source.assign(sources, 0);
  // The current piece's holders that overlap it (reused): index into `held`, source, box packed
  // as offsets then extents (in `regions`, or in `packed` for holders that disagree).
  std::vector<uint32_t> holder_index, holder_source;
  std::vector<const int64_t*> holder_box;
  std::vector<int64_t> packed;
  std::vector<std::vector<const WantedPiece*>> per_destination(destinations.size());
  std::vector<uint64_t> covered(destinations.size(), 0);
  for (const WantedPiece& p : wanted) {
    if (p.destination >= destinations.size()) {
      problems.Add("tensor '", p.name, "': wanted for destination ", p.destination, " of ",
                   destinations.size());
      continue;
    }
    const DestinationShape& dst = destinations[p.destination];
    const size_t n = dst.shape.size();
    if (p.global_shape.size() != n || !SameRank(p.box, n) || p.at.size() != n) {
      problems.Add("destination '", dst.name, "': a piece of '", p.name, "' has ",
                   p.global_shape.size(), " dims, the destination ", n);
      continue;
    }
    if (!InShape(p.box, p.box.offset, p.global_shape)) {
      problems.Add("destination '", dst.name, "': piece ", BoxString(p.box), " of '", p.name,
                   "' lies outside its global shape ", ShapeString(p.global_shape));
      continue;
    }
    if (!InShape(p.box, p.at, dst.shape)) {
      problems.Add("destination '", dst.name, "' ", ShapeString(dst.shape), ": piece ",
                   BoxString(p.box), " of '", p.name, "' placed at ", ShapeString(p.at),
                   " does not fit");
      continue;
    }
    const int bits = Info(dst.dtype).bits;
    if (bits % 8 != 0) {
      problems.Add("destination '", dst.name, "': regions of ", DTypeName(dst.dtype), " tensors (",
                   bits, "-bit elements) are not supported");
      continue;
    }
    per_destination[p.destination].push_back(&p);
    covered[p.destination] += p.box.elements();

    const HeldRegions::Holders* named = regions.HoldersOf(p.name);
    if (named == nullptr) {
      problems.Add("tensor '", p.name, "': wanted for destination '", dst.name,
                   "' but held by no publisher");
      continue;
    }
    holder_index.clear();
    holder_source.clear();
    holder_box.clear();
    packed.clear();
    bool consistent = true;
    const HeldTensor& first = held[named->index[0]];
    if (named->uniform && first.global_shape == p.global_shape && first.dtype == dst.dtype) {
      // Every holder agrees with the piece: only the overlap scan, over the packed boxes.
      const size_t stride = 2 * named->rank;
      for (size_t j = 0; j < named->index.size(); ++j) {
        if (Overlaps(named->boxes.data() + j * stride, named->rank, p.box)) {
          holder_index.push_back(named->index[j]);
          holder_source.push_back(held[named->index[j]].source);
          holder_box.push_back(named->boxes.data() + j * stride);
        }
      }
    } else {
      for (uint32_t i : named->index) {
        const HeldTensor& h = held[i];
        const Transform transform = TransformFor(h.dtype, dst.dtype);
        const bool castable = casts && transform == Transform::kCast;
        if (h.global_shape != p.global_shape || (h.dtype != dst.dtype && !castable)) {
          const char* why = "";
          if (h.dtype != dst.dtype && h.global_shape == p.global_shape) {
            why = transform == Transform::kCast && !casts
                      ? " (a cast: enable SubscriberOptions.convert_dtypes)"
                  : transform == Transform::kQuantizeFp8
                      ? " (bfloat16 -> float8_e4m3fn of regions is not supported; casts are)"
                      : "";
          }
          problems.Add("tensor '", p.name, "': publisher ", h.source, " holds it as ",
                       DTypeName(h.dtype), " ", ShapeString(h.global_shape), ", destination '",
                       dst.name, "' wants ", DTypeName(dst.dtype), " ", ShapeString(p.global_shape),
                       why);
          consistent = false;
          continue;
        }
        if (Overlaps(h.box, p.box)) {
          holder_index.push_back(i);
          holder_source.push_back(h.source);
          packed.insert(packed.end(), h.box.offset.begin(), h.box.offset.end());
          packed.insert(packed.end(), h.box.extent.begin(), h.box.extent.end());
        }
      }
      for (size_t j = 0; j < holder_index.size(); ++j) {
        holder_box.push_back(packed.data() + j * 2 * n);
      }
    }
    if (!consistent) continue;
    const uint64_t dst_element_bytes = static_cast<uint64_t>(bits / 8);
    for (const Box& cell : Cells(p.box, holder_box)) {
      // The least-loaded holder covering the cell, one that needs no cast first (it moves fewer
      // or the same bytes and lands on every path); ties from `rotation` on.
      int best = -1;
      auto casts_from = [&](size_t j) { return held[holder_index[j]].dtype != dst.dtype; };
      for (size_t j = 0; j < holder_box.size(); ++j) {
        if (!Covers(holder_box[j], n, cell)) continue;
        if (best < 0) {
          best = static_cast<int>(j);
          continue;
        }
        const uint32_t a = holder_source[j], b = holder_source[best];
        const uint32_t ra = (a + sources - rotation % sources) % sources;
        const uint32_t rb = (b + sources - rotation % sources) % sources;
        const bool ca = casts_from(j), cb = casts_from(best);
        if (ca != cb) {
          if (!ca) best = static_cast<int>(j);
          continue;
        }
        if (loads[a] < loads[b] || (loads[a] == loads[b] && ra < rb)) best = static_cast<int>(j);
      }
      if (best < 0) {
        problems.Add("tensor '", p.name, "' ", BoxString(cell), " (for destination '", dst.name,
                     "'): held by no publisher");
        continue;
      }
      // What moves is the holder's bytes (a cast converts them on arrival).
      const HeldTensor& from = held[holder_index[best]];
      const uint64_t element_bytes = static_cast<uint64_t>(Info(from.dtype).bits / 8);
      const uint64_t bytes = cell.elements() * element_bytes;
      const uint32_t source = holder_source[best];
      loads[source] += bytes;
      schedule.bytes_per_source[source] += bytes;
      schedule.total_bytes += bytes;
      EmitCopies(cell, holder_index[best], from, p, dst.shape, element_bytes, dst_element_bytes,
                 &schedule.copies);
    }
  }
  // Every destination byte exactly once: no two pieces write the same bytes, and together they
  // write all of them.
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    const auto& pieces = per_destination[d];
    bool overlap = false;
    for (size_t i = 0; i < pieces.size(); ++i) {
      for (size_t j = i + 1; j < pieces.size(); ++j) {
        const Box a{pieces[i]->at, pieces[i]->box.extent}, b{pieces[j]->at, pieces[j]->box.extent};
        if (auto both = Intersect(a, b)) {
          problems.Add("destination '", destinations[d].name, "': pieces of '", pieces[i]->name,
                       "' and '", pieces[j]->name, "' both write ", BoxString(*both));
          overlap = true;
        }
      }
    }
    uint64_t elements = 1;
    for (int64_t e : destinations[d].shape) elements *= static_cast<uint64_t>(e);
    if (!overlap && destinations[d].written && covered[d] != elements) {
      problems.Add("destination '", destinations[d].name, "' ", ShapeString(destinations[d].shape),
                   ": its pieces write ", covered[d], " of ", elements, " elements");
    }
  }
  if (!problems.empty()) return problems.ToStatus();
  return schedule;
}

std::vector<WantedPiece> Fused(uint32_t destination, int dim, const std::vector<FusedPart>& parts) {
  std::vector<WantedPiece> pieces;
  int64_t at = 0;
  for (const FusedPart& part : parts) {
    WantedPiece p{destination, part.name, part.global_shape, part.box,
                  std::vector<int64_t>(part.global_shape.size(), 0)};
    if (dim >= 0 && static_cast<size_t>(dim) < p.at.size()) {
      p.at[dim] = at;
      at += part.box.extent[dim];
    }
    pieces.push_back(std::move(p));
  }
  return pieces;
}

Box EvenShard(const std::vector<int64_t>& global_shape, int dim, int parts, int rank) {
  RegionPart part = Shard("", global_shape, dim, parts, rank);  // the public API's split
  return {std::move(part.offset), std::move(part.extent)};
}

}  // namespace weightsync::plan
