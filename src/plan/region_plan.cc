#include "plan/region_plan.h"

#include <algorithm>
#include <tuple>

#include "plan/segments.h"

namespace weightsync::plan {
namespace {

constexpr uint64_t kShadowAlignment = 64;

// `bytes` of published tensor `tensor` at `src` go to destination `destination` at `dst`, as
// `dst_bytes` there (the same elements: more or fewer bytes when the run casts to `to`).
struct Run {
  uint32_t tensor = 0;
  uint64_t src = 0;
  uint32_t destination = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
  uint64_t dst_bytes = 0;
  DType to = DType::kUInt8;  // the destination's dtype (the published one when no cast)
  uint64_t digest = 0;       // for_verify: the digest segment (of `tensor`) it lies in
};

bool Continues(const Run& a, const Run& b) {
  return a.tensor == b.tensor && a.src + a.bytes == b.src && a.destination == b.destination &&
         a.dst + a.dst_bytes == b.dst && a.to == b.to;
}

uint64_t ElementBytes(DType d) { return static_cast<uint64_t>(Info(d).bits / 8); }

// Bytes a copy or cast unit writes into its destination.
uint64_t WrittenBytes(const PlannedTensor& t) {
  return t.transform == Transform::kCast ? t.elements * ElementBytes(t.to) : t.nbytes;
}

// Every row of every copy, checked against both tensors, sorted by where it is read.
Result<std::vector<Run>> Runs(const wire::Welcome& welcome,
                              const std::vector<Destination>& destinations,
                              const std::vector<RegionCopy>& copies) {
  std::vector<Run> runs;
  for (const RegionCopy& c : copies) {
    if (c.held >= welcome.tensors.size() || c.destination >= destinations.size()) {
      return Status::Internal("region plan: copy of tensor ", c.held, " into destination ",
                              c.destination, " but there are ", welcome.tensors.size(), " and ",
                              destinations.size());
    }
    const TensorSpec& from = welcome.tensors[c.held].spec;
    const TensorSpec& to = destinations[c.destination].spec;
    const uint64_t src_size = from.nbytes, dst_size = to.nbytes;
    const uint64_t written = c.written_run_bytes();
    // A cast must convert whole elements of one castable dtype into another, and say so.
    if (from.dtype != to.dtype
            ? TransformFor(from.dtype, to.dtype) != Transform::kCast ||
                  c.run_bytes % ElementBytes(from.dtype) != 0 ||
                  written != c.run_bytes / ElementBytes(from.dtype) * ElementBytes(to.dtype)
            : written != c.run_bytes) {
      return Status::Internal("region plan: a copy from '", from.name, "' (", DTypeName(from.dtype),
                              ") into '", to.name, "' (", DTypeName(to.dtype), ") of ", c.run_bytes,
                              " bytes per row writes ", written);
    }
    if (c.run_bytes == 0) continue;
    for (uint64_t r = 0; r < c.rows; ++r) {
      uint64_t src = 0, dst = 0, src_end = 0, dst_end = 0;
      // The offsets feed raw copies: prove each run lies inside both tensors.
      if (__builtin_mul_overflow(r, c.src_pitch, &src) ||
          __builtin_add_overflow(src, c.src_offset, &src) ||
          __builtin_add_overflow(src, c.run_bytes, &src_end) || src_end > src_size ||
          __builtin_mul_overflow(r, c.dst_pitch, &dst) ||
          __builtin_add_overflow(dst, c.dst_offset, &dst) ||
          __builtin_add_overflow(dst, written, &dst_end) || dst_end > dst_size) {
        return Status::Internal("region plan: row ", r, " of a copy from '", from.name, "' into '",
                                to.name, "' lies outside one of them");
      }
      runs.push_back({c.held, src, c.destination, dst, c.run_bytes, written, to.dtype, 0});
    }
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
    return std::tie(a.tensor, a.src, a.destination, a.dst) <
           std::tie(b.tensor, b.src, b.destination, b.dst);
  });
  // Rows of neighbouring cells (and whole dim-0 cuts) often continue each other on both sides.
  std::vector<Run> merged;
  for (const Run& run : runs) {
    if (!merged.empty() && Continues(merged.back(), run)) {
      merged.back().bytes += run.bytes;
      merged.back().dst_bytes += run.dst_bytes;
    } else {
      merged.push_back(run);
    }
  }
  return merged;
}

PlannedTensor Unit(const wire::Welcome& welcome, const Run& run) {
  PlannedTensor t;
  t.publisher_index = run.tensor;
  t.destination = run.destination;
  t.src_offset = run.src;
  t.dst_offset = run.dst;
  t.nbytes = run.bytes;
  t.from = welcome.tensors[run.tensor].spec.dtype;
  t.to = run.to;
  if (t.from != t.to) {  // converted at commit, from the shadow or the landing buffer
    t.transform = Transform::kCast;
    t.elements = run.bytes / ElementBytes(t.from);
  }
  return t;
}

// for_verify: cuts the runs at digest-segment boundaries; a segment that is one whole piece stays
// a copy or a cast (merged again with its neighbours), any other becomes one kExtract tensor of
// the whole segment with its pieces (each copied or cast at commit). InvalidArgument if a cast
// would be cut inside an element.
Status VerifiableUnits(const wire::Welcome& welcome, std::vector<Run> runs, Plan* plan) {
  const uint64_t segment = welcome.segment_bytes;
  std::vector<Run> pieces;
  for (const Run& run : runs) {
    const DType published = welcome.tensors[run.tensor].spec.dtype;
    const uint64_t from = ElementBytes(published);
    const uint64_t to = ElementBytes(run.to);
    // A piece of a cast is whole elements only when digest segments are: a segment edge inside
    // an element would split it between two casts. (Copies cut anywhere: they move bytes.)
    if (run.to != published && segment % from != 0) {
      return Status::InvalidArgument("region plan: tensor '", welcome.tensors[run.tensor].spec.name,
                                     "' is cast from ", DTypeName(published),
                                     " and verified, but the publisher's digest segments of ",
                                     segment, " bytes split its ", from, "-byte elements");
    }
    for (uint64_t done = 0; done < run.bytes;) {
      const uint64_t at = run.src + done;
      const uint64_t digest = at / segment;
      const uint64_t bytes = std::min(run.bytes - done, (digest + 1) * segment - at);
      const bool cast = run.to != published;
      pieces.push_back({run.tensor, at, run.destination, run.dst + (cast ? done / from * to : done),
                        bytes, cast ? bytes / from * to : bytes, run.to, digest});
      done += bytes;
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(), [](const Run& a, const Run& b) {
    return std::tie(a.tensor, a.digest, a.src) < std::tie(b.tensor, b.digest, b.src);
  });
  for (size_t i = 0; i < pieces.size();) {
    size_t end = i + 1;
    while (end < pieces.size() && pieces[end].tensor == pieces[i].tensor &&
           pieces[end].digest == pieces[i].digest) {
      ++end;
    }
    const uint64_t nbytes = welcome.tensors[pieces[i].tensor].spec.nbytes;
    const uint64_t start = pieces[i].digest * segment;
    const uint64_t length = std::min(segment, nbytes - start);
    if (end == i + 1 && pieces[i].src == start && pieces[i].bytes == length) {
      PlannedTensor* last = plan->tensors.empty() ? nullptr : &plan->tensors.back();
      PlannedTensor next = Unit(welcome, pieces[i]);
      if (last != nullptr && last->transform == next.transform && last->to == next.to &&
          last->publisher_index == next.publisher_index &&
          last->src_offset + last->nbytes == next.src_offset &&
          last->destination == next.destination &&
          last->dst_offset + WrittenBytes(*last) == next.dst_offset) {
        last->nbytes += next.nbytes;
        last->elements += next.elements;
      } else {
        plan->tensors.push_back(next);
      }
    } else {
      PlannedTensor t = Unit(welcome, pieces[i]);
      t.src_offset = start;
      t.dst_offset = 0;
      t.nbytes = length;
      t.transform = Transform::kExtract;
      t.to = t.from;
      t.elements = 0;
      t.first_extract = static_cast<uint32_t>(plan->extracts.size());
      t.extract_count = static_cast<uint32_t>(end - i);
      for (size_t k = i; k < end; ++k) {
        plan->extracts.push_back({pieces[k].src - start, pieces[k].destination, pieces[k].dst,
                                  pieces[k].bytes, pieces[k].to});
      }
      plan->tensors.push_back(t);
    }
    i = end;
  }
  return Status::Ok();
}

uint64_t Align(uint64_t v) {
  return (v + kShadowAlignment - 1) / kShadowAlignment * kShadowAlignment;
}

}  // namespace

Result<Plan> BuildRegionPlan(const wire::Welcome& welcome,
                             const std::vector<Destination>& destinations,
                             const std::vector<RegionCopy>& copies, uint64_t bucket_bytes,
                             bool for_verify) {
  WS_RETURN_IF_ERROR(ValidateLayout(welcome));
  WS_ASSIGN_OR_RETURN(std::vector<Run> runs, Runs(welcome, destinations, copies));
  Plan plan;
  plan.regions = true;
  std::vector<bool> written(destinations.size(), false);
  for (const Run& run : runs) written[run.destination] = true;
  plan.destination_count = static_cast<uint32_t>(std::count(written.begin(), written.end(), true));
  if (for_verify) {
    WS_RETURN_IF_ERROR(VerifiableUnits(welcome, std::move(runs), &plan));
  } else {
    for (const Run& run : runs) plan.tensors.push_back(Unit(welcome, run));
  }
  // Sizes: every run lies inside a published tensor, whose sizes sum below 2^64 (the layout), but
  // runs may read the same bytes for several destinations: overflow-check the sums.
  const uint64_t segment = welcome.segment_bytes;
  plan.verifiable = true;
  for (uint32_t k = 0; k < plan.tensors.size(); ++k) {
    PlannedTensor& t = plan.tensors[k];
    const wire::TensorPlacement& p = welcome.tensors[t.publisher_index];
    const uint64_t end = t.src_offset + t.nbytes;
    plan.verifiable = plan.verifiable && t.src_offset % segment == 0 &&
                      (end % segment == 0 || end == p.spec.nbytes);
    t.shadow_offset = Align(plan.shadow_bytes);
    if (__builtin_add_overflow(t.shadow_offset, t.nbytes, &plan.shadow_bytes) ||
        __builtin_add_overflow(plan.total_bytes, t.nbytes, &plan.total_bytes)) {
      return Status::InvalidArgument("region plan: more than 2^64 bytes to move");
    }
    if (t.transform != Transform::kCopy) {  // kCast, kExtract: landed, then written at commit
      plan.converted.push_back(k);
      t.landing_offset = Align(plan.landing_bytes);
      plan.landing_bytes = t.landing_offset + t.nbytes;
    }
    if (p.region == wire::Region::kSlot) plan.uses_slots = true;
    if (p.region == wire::Region::kDirect) plan.uses_direct = true;
  }
  std::vector<uint32_t> digest_base;
  plan.digest_count = static_cast<uint32_t>(DigestBases(welcome, &digest_base));
  CutSegments(welcome, digest_base, &plan);
  GroupBuckets(bucket_bytes, &plan);
  return plan;
}

}  // namespace weightsync::plan
