#include "plan/region_plan.h"

#include <algorithm>
#include <tuple>

#include "plan/segments.h"

namespace weightsync::plan {
namespace {

constexpr uint64_t kShadowAlignment = 64;

// `bytes` of published tensor `tensor` at `src` go to destination `destination` at `dst`.
struct Run {
  uint32_t tensor = 0;
  uint64_t src = 0;
  uint32_t destination = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
  uint64_t digest = 0;  // for_verify: the digest segment (of `tensor`) it lies in
};

bool Continues(const Run& a, const Run& b) {
  return a.tensor == b.tensor && a.src + a.bytes == b.src && a.destination == b.destination &&
         a.dst + a.bytes == b.dst;
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
    const uint64_t src_size = welcome.tensors[c.held].spec.nbytes;
    const uint64_t dst_size = destinations[c.destination].spec.nbytes;
    if (c.run_bytes == 0) continue;
    for (uint64_t r = 0; r < c.rows; ++r) {
      uint64_t src = 0, dst = 0, src_end = 0, dst_end = 0;
      // The offsets feed raw copies: prove each run lies inside both tensors.
      if (__builtin_mul_overflow(r, c.src_pitch, &src) ||
          __builtin_add_overflow(src, c.src_offset, &src) ||
          __builtin_add_overflow(src, c.run_bytes, &src_end) || src_end > src_size ||
          __builtin_mul_overflow(r, c.dst_pitch, &dst) ||
          __builtin_add_overflow(dst, c.dst_offset, &dst) ||
          __builtin_add_overflow(dst, c.run_bytes, &dst_end) || dst_end > dst_size) {
        return Status::Internal(
            "region plan: row ", r, " of a copy from '", welcome.tensors[c.held].spec.name,
            "' into '", destinations[c.destination].spec.name, "' lies outside one of them");
      }
      runs.push_back({c.held, src, c.destination, dst, c.run_bytes, 0});
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
    } else {
      merged.push_back(run);
    }
  }
  return merged;
}

PlannedTensor Unit(const Run& run) {
  PlannedTensor t;
  t.publisher_index = run.tensor;
  t.destination = run.destination;
  t.src_offset = run.src;
  t.dst_offset = run.dst;
  t.nbytes = run.bytes;
  return t;
}

// for_verify: cuts the runs at digest-segment boundaries; a segment that is one whole piece stays
// a copy (merged again with its neighbours), any other becomes one kExtract tensor of the whole
// segment with its pieces.
void VerifiableUnits(const wire::Welcome& welcome, std::vector<Run> runs, Plan* plan) {
  const uint64_t segment = welcome.segment_bytes;
  std::vector<Run> pieces;
  for (const Run& run : runs) {
    for (uint64_t done = 0; done < run.bytes;) {
      const uint64_t at = run.src + done;
      const uint64_t digest = at / segment;
      const uint64_t bytes = std::min(run.bytes - done, (digest + 1) * segment - at);
      pieces.push_back({run.tensor, at, run.destination, run.dst + done, bytes, digest});
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
      if (last != nullptr && last->transform == Transform::kCopy &&
          last->publisher_index == pieces[i].tensor &&
          last->src_offset + last->nbytes == pieces[i].src &&
          last->destination == pieces[i].destination &&
          last->dst_offset + last->nbytes == pieces[i].dst) {
        last->nbytes += pieces[i].bytes;
      } else {
        plan->tensors.push_back(Unit(pieces[i]));
      }
    } else {
      PlannedTensor t = Unit(pieces[i]);
      t.src_offset = start;
      t.dst_offset = 0;
      t.nbytes = length;
      t.transform = Transform::kExtract;
      t.first_extract = static_cast<uint32_t>(plan->extracts.size());
      t.extract_count = static_cast<uint32_t>(end - i);
      for (size_t k = i; k < end; ++k) {
        plan->extracts.push_back(
            {pieces[k].src - start, pieces[k].destination, pieces[k].dst, pieces[k].bytes});
      }
      plan->tensors.push_back(t);
    }
    i = end;
  }
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
    VerifiableUnits(welcome, std::move(runs), &plan);
  } else {
    for (const Run& run : runs) plan.tensors.push_back(Unit(run));
  }
  // Sizes: every run lies inside a published tensor, whose sizes sum below 2^64 (the layout), but
  // runs may read the same bytes for several destinations: overflow-check the sums.
  const uint64_t segment = welcome.segment_bytes;
  plan.verifiable = true;
  for (uint32_t k = 0; k < plan.tensors.size(); ++k) {
    PlannedTensor& t = plan.tensors[k];
    const wire::TensorPlacement& p = welcome.tensors[t.publisher_index];
    t.from = t.to = p.spec.dtype;
    const uint64_t end = t.src_offset + t.nbytes;
    plan.verifiable = plan.verifiable && t.src_offset % segment == 0 &&
                      (end % segment == 0 || end == p.spec.nbytes);
    t.shadow_offset = Align(plan.shadow_bytes);
    if (__builtin_add_overflow(t.shadow_offset, t.nbytes, &plan.shadow_bytes) ||
        __builtin_add_overflow(plan.total_bytes, t.nbytes, &plan.total_bytes)) {
      return Status::InvalidArgument("region plan: more than 2^64 bytes to move");
    }
    if (t.transform == Transform::kExtract) {
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
