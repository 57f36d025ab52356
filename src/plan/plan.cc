// Plan construction. Everything here runs once per transfer handle; the hot path only walks the
// arrays produced here, so this file favours clear, exhaustive checks over speed.
//
// The Welcome comes from another process. Every offset the plan emits is later used for a raw
// memcpy out of the mapped arena, so ValidateLayout proves each byte range lies inside the arena
// with overflow-checked arithmetic before any of those offsets are trusted.

#include "plan/plan.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "plan/block_scaled_plan.h"
#include "plan/mismatch_list.h"
#include "plan/segments.h"
#include "weightsync/dtype.h"
#include "weightsync/tensor_view.h"

namespace weightsync::plan {
namespace {

// Shadow-buffer start alignment of every planned tensor: one cache line, so that copy workers
// filling neighbouring tensors never share a line, and vectorised copies start aligned.
constexpr uint64_t kShadowAlignment = 64;

uint64_t AlignUp(uint64_t v) { return (v + kShadowAlignment - 1) & ~(kShadowAlignment - 1); }

bool IsCastable(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

// Fills the conversion fields of `t` (same shape on both sides already checked); the error
// message completes "tensor 'NAME': ".
Status PlanConversion(const TensorSpec& src, const std::vector<Destination>& destinations,
                      const std::unordered_map<std::string_view, uint32_t>& by_name,
                      const ConvertOptions& convert, PlannedTensor* t) {
  uint64_t elements = 1;
  for (int64_t dim : src.shape) elements *= static_cast<uint64_t>(dim);  // validated manifest
  t->elements = elements;
  Result<uint64_t> from_bytes = ByteSize(src.dtype, elements);
  Result<uint64_t> to_bytes = ByteSize(t->to, elements);
  const TensorSpec& dst = destinations[t->destination].spec;
  if (!from_bytes.ok() || !to_bytes.ok() || *from_bytes != src.nbytes || *to_bytes != dst.nbytes) {
    return Status::InvalidArgument("byte sizes ", src.nbytes, " (publisher) and ", dst.nbytes,
                                   " (subscriber) do not fit ", elements, " elements");
  }
  if (t->transform == Transform::kQuantizeMxfp8 || t->transform == Transform::kQuantizeNvfp4) {
    return PlanBlockScaled(src, destinations, by_name, convert, t);
  }
  if (t->transform != Transform::kQuantizeFp8) return Status::Ok();
  // rows = the product of every dimension but the last, also when the last is 0 (a [256, 0]
  // tensor has 256 rows of nothing: scales [2, 0]), so the scale shape follows the documented rule
  // for every shape.
  t->cols = src.shape.empty() ? 1 : src.shape.back();
  t->rows = 1;
  for (size_t i = 0; i + 1 < src.shape.size(); ++i) t->rows *= src.shape[i];
  const std::string scale_name = src.name + convert.scale_suffix;
  auto it = by_name.find(scale_name);
  const std::vector<int64_t> want{(t->rows + 127) / 128, (t->cols + 127) / 128};
  if (it == by_name.end()) {
    return Status::InvalidArgument("bfloat16 → float8_e4m3fn needs a scale destination '",
                                   scale_name, "' (float32 or float8_e8m0fnu, shape ",
                                   ShapeString(want), "); none is registered");
  }
  const TensorSpec& scale = destinations[it->second].spec;
  if (scale.dtype != DType::kFloat32 && scale.dtype != DType::kFloat8E8M0FNU) {
    return Status::InvalidArgument("scale destination '", scale_name, "' is ",
                                   DTypeName(scale.dtype), "; float32 or float8_e8m0fnu expected");
  }
  if (scale.shape != want) {
    return Status::InvalidArgument("scale destination '", scale_name, "' has shape ",
                                   ShapeString(scale.shape), "; 128x128 blocks of ",
                                   ShapeString({t->rows, t->cols}), " need ", ShapeString(want));
  }
  t->scale_destination = it->second;
  t->e8m0_scales = scale.dtype == DType::kFloat8E8M0FNU;
  return Status::Ok();
}

const char* RegionName(wire::Region region) {
  switch (region) {
    case wire::Region::kDirect:
      return "direct";
    case wire::Region::kSlot:
      return "slot";
  }
  return "unknown";
}

// Checks that [offset, offset + size) lies inside [0, limit). `what` names the range in errors,
// e.g. "direct region".
Status CheckRange(std::string_view what, uint64_t offset, uint64_t size, uint64_t limit,
                  std::string_view limit_name) {
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, size, &end)) {
    return Status::ProtocolError("welcome: ", what, " offset ", offset, " + size ", size,
                                 " overflows uint64");
  }
  if (end > limit) {
    return Status::ProtocolError("welcome: ", what, " [", offset, ", ", end, ") exceeds ",
                                 limit_name, " ", limit);
  }
  return Status::Ok();
}

// A ring store: two slots at least (one filled while another is read), no arena-allocated
// tensors, and `*version_bytes` (version_buckets × slot_bytes) not overflowing.
Status CheckRing(const wire::Welcome& welcome, uint64_t* version_bytes) {
  if (welcome.version_buckets == 0) {
    return Status::ProtocolError("welcome: a ring store with version_buckets 0");
  }
  if (welcome.slot_count < 2 || welcome.slot_bytes == 0) {
    return Status::ProtocolError("welcome: a ring store needs 2 or more slots of > 0 bytes, has ",
                                 welcome.slot_count, " of ", welcome.slot_bytes);
  }
  if (welcome.direct_bytes > 0) {
    return Status::ProtocolError("welcome: a ring store with a direct region of ",
                                 welcome.direct_bytes, " bytes");
  }
  if (__builtin_mul_overflow(welcome.slot_bytes, uint64_t{welcome.version_buckets},
                             version_bytes)) {
    return Status::ProtocolError("welcome: version_buckets ", welcome.version_buckets,
                                 " * slot_bytes ", welcome.slot_bytes, " overflows uint64");
  }
  return Status::Ok();
}

// A kCudaIpc store's allocations: sorted, disjoint, inside the direct region, and every direct
// tensor inside one of them; other stores have none. A kCudaIpc store serving over tcp lists
// none (it exports nothing; the link's end checks that a local one does: ChoosePath).
Status CheckAllocations(const wire::Welcome& welcome) {
  if (welcome.arena_kind != wire::ArenaKind::kCudaIpc || welcome.allocations.empty()) {
    if (welcome.allocations.empty()) return Status::Ok();
    return Status::ProtocolError("welcome: ", welcome.allocations.size(),
                                 " CUDA IPC allocations in a store of another kind");
  }
  // Every allocation holds a tensor: no more of them than tensors (each is opened at prepare).
  if (welcome.allocations.size() > welcome.tensors.size()) {
    return Status::ProtocolError("welcome: ", welcome.allocations.size(),
                                 " CUDA IPC allocations for ", welcome.tensors.size(), " tensors");
  }
  uint64_t end = 0;
  for (size_t i = 0; i < welcome.allocations.size(); ++i) {
    const wire::GpuAllocation& a = welcome.allocations[i];
    if (a.bytes == 0) return Status::ProtocolError("welcome: allocation ", i, " is empty");
    if (a.offset < end) {
      return Status::ProtocolError("welcome: allocation ", i, " at ", a.offset,
                                   " overlaps or precedes the one before it (ending at ", end, ")");
    }
    WS_RETURN_IF_ERROR(CheckRange("allocation " + std::to_string(i), a.offset, a.bytes,
                                  welcome.direct_bytes, "direct region size"));
    end = a.offset + a.bytes;
    if (a.kind != wire::AllocationKind::kPosixFdChunks) continue;
    // The chunks are mapped back to back: they must tile the allocation exactly.
    uint64_t tiled = 0;
    for (size_t c = 0; c < a.chunk_bytes.size(); ++c) {
      if (a.chunk_bytes[c] == 0 || a.chunk_bytes[c] > a.bytes - tiled) {
        return Status::ProtocolError("welcome: allocation ", i, " chunk ", c, " (",
                                     a.chunk_bytes[c], " bytes) is empty or runs past its ",
                                     a.bytes, " bytes");
      }
      tiled += a.chunk_bytes[c];
    }
    if (tiled != a.bytes) {
      return Status::ProtocolError("welcome: allocation ", i, " has ", a.bytes, " bytes but its ",
                                   a.chunk_bytes.size(), " chunks hold ", tiled);
    }
  }
  for (const wire::TensorPlacement& p : welcome.tensors) {
    if (p.spec.nbytes == 0) continue;
    if (p.region != wire::Region::kDirect ||
        AllocationHolding(welcome, p.offset, p.spec.nbytes) < 0) {
      return Status::ProtocolError("welcome: tensor '", p.spec.name, "' [", p.offset, ", ",
                                   p.offset + p.spec.nbytes,
                                   ") lies in none of the publisher's CUDA allocations");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateLayout(const wire::Welcome& welcome) {
  if (welcome.segment_bytes == 0) {
    return Status::ProtocolError("welcome: segment_bytes is 0; must be > 0");
  }
  if (welcome.tensors.size() > kMaxTensors) {
    return Status::ProtocolError("welcome: ", welcome.tensors.size(), " tensors exceed the limit ",
                                 kMaxTensors);
  }
  if (welcome.slot_count > wire::kMaxSlots) {
    return Status::ProtocolError("welcome: slot_count ", welcome.slot_count, " exceeds the limit ",
                                 wire::kMaxSlots);
  }
  // A GPU arena or ring holds registered tensors in its slots only (no publisher allocates GPU
  // tensors in its store); a zero-copy publisher's tensors are all in its direct region.
  if ((welcome.arena_kind == wire::ArenaKind::kCudaMem ||
       welcome.arena_kind == wire::ArenaKind::kCudaRing) &&
      welcome.direct_bytes > 0) {
    return Status::ProtocolError("welcome: a GPU ",
                                 wire::IsRing(welcome.arena_kind) ? "ring" : "arena",
                                 " with a direct region of ", welcome.direct_bytes,
                                 " bytes; GPU stores hold registered tensors in slots only");
  }
  // Empty regions are never read, so a publisher without one may leave its offset at any value.
  if (welcome.direct_bytes > 0) {
    WS_RETURN_IF_ERROR(CheckRange("direct region", welcome.direct_offset, welcome.direct_bytes,
                                  welcome.arena_bytes, "arena size"));
  }
  if (welcome.slot_count > 0 && welcome.slot_bytes > 0) {
    uint64_t all_slots = 0;
    if (__builtin_mul_overflow(welcome.slot_bytes, uint64_t{welcome.slot_count}, &all_slots)) {
      return Status::ProtocolError("welcome: slot_bytes ", welcome.slot_bytes, " * slot_count ",
                                   welcome.slot_count, " overflows uint64");
    }
    WS_RETURN_IF_ERROR(CheckRange("slots region", welcome.slots_offset, all_slots,
                                  welcome.arena_bytes, "arena size"));
  }

  // A ring's slots are its buckets; a version is version_buckets of them, streamed through.
  uint64_t version_bytes = welcome.slot_bytes;
  if (wire::IsRing(welcome.arena_kind)) {
    WS_RETURN_IF_ERROR(CheckRing(welcome, &version_bytes));
  }

  // Names must be unique: the plan matches by name, and a duplicate would make the match depend
  // on which copy happened to be found.
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(welcome.tensors.size());
  uint64_t digests = 0;
  uint64_t slot_end = 0;  // where the last slot tensor ends
  for (size_t i = 0; i < welcome.tensors.size(); ++i) {
    const wire::TensorPlacement& p = welcome.tensors[i];
    const std::string& name = p.spec.name;
    if (auto [it, inserted] = seen.emplace(name, i); !inserted) {
      return Status::ProtocolError("welcome: tensor '", name, "' appears twice (indices ",
                                   it->second, " and ", i, ")");
    }
    uint64_t region_bytes = 0;
    switch (p.region) {
      case wire::Region::kDirect:
        region_bytes = welcome.direct_bytes;
        break;
      case wire::Region::kSlot:
        if (welcome.slot_count == 0) {
          return Status::ProtocolError("welcome: tensor '", name,
                                       "' is in a slot but slot_count is 0");
        }
        region_bytes = version_bytes;
        break;
      default:
        return Status::ProtocolError("welcome: tensor '", name, "' region ",
                                     static_cast<unsigned>(p.region), " is unknown");
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(p.offset, p.spec.nbytes, &end)) {
      return Status::ProtocolError("welcome: tensor '", name, "' ", RegionName(p.region),
                                   " offset ", p.offset, " + nbytes ", p.spec.nbytes,
                                   " overflows uint64");
    }
    if (end > region_bytes) {
      return Status::ProtocolError("welcome: tensor '", name, "' ", RegionName(p.region),
                                   " range [", p.offset, ", ", end, ") exceeds ",
                                   RegionName(p.region), " size ", region_bytes);
    }
    if (p.region == wire::Region::kSlot) slot_end = std::max(slot_end, end);
    // StepEnd carries at most kMaxDigests digests and the plan indexes them with uint32, so a
    // layout needing more can never be served. A hostile nbytes can make one term near 2^64.
    if (__builtin_add_overflow(digests, SegmentCount(p.spec.nbytes, welcome.segment_bytes),
                               &digests) ||
        digests > wire::kMaxDigests) {
      return Status::ProtocolError("welcome: tensors up to '", name,
                                   "' need more digest segments of ", welcome.segment_bytes,
                                   " bytes than the limit ", wire::kMaxDigests);
    }
  }
  // A ring streams every bucket of a version each step, and the subscriber prepares a batch per
  // bucket: buckets past the tensors' end (one more for the publisher's alignment padding) would
  // only cost it memory and round trips.
  if (wire::IsRing(welcome.arena_kind)) {
    const uint64_t used = SegmentCount(slot_end, welcome.slot_bytes);
    if (welcome.version_buckets > used + 1) {
      return Status::ProtocolError("welcome: a ring version of ", welcome.version_buckets,
                                   " buckets of ", welcome.slot_bytes,
                                   " bytes, but its tensors end at byte ", slot_end, " (", used,
                                   " buckets)");
    }
  }
  return CheckAllocations(welcome);
}

std::vector<int64_t> PublishedAliases(const wire::Welcome& welcome) {
  std::vector<int64_t> alias(welcome.tensors.size(), -1);
  // (region, offset) → the first tensor placed there.
  std::map<std::pair<wire::Region, uint64_t>, size_t> first;
  for (size_t i = 0; i < welcome.tensors.size(); ++i) {
    const wire::TensorPlacement& p = welcome.tensors[i];
    if (p.spec.nbytes == 0 || p.sharded) continue;
    auto [it, fresh] = first.emplace(std::make_pair(p.region, p.offset), i);
    if (fresh) continue;
    const wire::TensorPlacement& original = welcome.tensors[it->second];
    if (original.spec.dtype == p.spec.dtype && original.spec.shape == p.spec.shape) {
      alias[i] = static_cast<int64_t>(it->second);
    }
  }
  return alias;
}

int64_t AllocationHolding(const wire::Welcome& welcome, uint64_t offset, uint64_t bytes) {
  const auto& all = welcome.allocations;
  // The last allocation starting at or before `offset` (they are sorted and disjoint).
  auto it =
      std::upper_bound(all.begin(), all.end(), offset,
                       [](uint64_t at, const wire::GpuAllocation& a) { return at < a.offset; });
  if (it == all.begin()) return -1;
  --it;
  if (offset - it->offset > it->bytes || bytes > it->bytes - (offset - it->offset)) return -1;
  return it - all.begin();
}

uint32_t AllocationFdCount(const wire::Welcome& welcome) {
  uint64_t count = 0;  // the decoder bounds the sum by kMaxAllocations
  for (const wire::GpuAllocation& a : welcome.allocations) count += a.chunk_bytes.size();
  return static_cast<uint32_t>(count);
}

Status CheckVerifiable(const Plan& plan, int64_t step) {
  if (plan.verifiable) return Status::Ok();
  return Status::FailedPrecondition(
      "step ", step,
      ": this handle's region plan reads parts of digest segments and was not prepared for "
      "verification");
}

ConvertedFootprint ConvertedOf(const Plan& plan) {
  ConvertedFootprint out;
  for (uint32_t k : plan.converted) {
    const PlannedTensor& t = plan.tensors[k];
    bool converts = t.transform != Transform::kExtract;
    for (uint32_t e = 0; !converts && e < t.extract_count; ++e) {
      converts = plan.extracts[t.first_extract + e].to != t.from;
    }
    if (!converts) continue;
    ++out.tensors;
    out.bytes += t.nbytes;
  }
  return out;
}

uint64_t SegmentCount(uint64_t nbytes, uint64_t segment_bytes) {
  // segment_bytes == 0 is rejected by ValidateLayout; answering 0 keeps a misuse from trapping.
  if (segment_bytes == 0) return 0;
  // Written without nbytes + segment_bytes - 1, which overflows near 2^64.
  return nbytes / segment_bytes + (nbytes % segment_bytes != 0 ? 1 : 0);
}

Transform TransformFor(DType from, DType to) {
  if (from == to) return Transform::kCopy;
  if (IsCastable(from) && IsCastable(to)) return Transform::kCast;
  if (from == DType::kBFloat16 && to == DType::kFloat8E4M3FN) return Transform::kQuantizeFp8;
  return Transform::kCopy;
}

const char* TransformName(Transform t) {
  switch (t) {
    case Transform::kCopy:
      return "copy";
    case Transform::kCast:
      return "cast";
    case Transform::kQuantizeFp8:
      return "fp8 quantization";
    case Transform::kQuantizeMxfp8:
      return "MXFP8 quantization";
    case Transform::kQuantizeNvfp4:
      return "NVFP4 quantization";
    case Transform::kExtract:
      return "region extraction";
  }
  return "unknown";
}

void CutSegments(const wire::Welcome& welcome, const std::vector<uint32_t>& digest_base,
                 Plan* plan) {
  for (PlannedTensor& t : plan->tensors) {
    const wire::TensorPlacement& p = welcome.tensors[t.publisher_index];
    t.first_segment = static_cast<uint32_t>(plan->segments.size());
    // Segments start where the planned tensor does: on the digest grid for a whole tensor and
    // for the runs of a verifiable region plan.
    uint32_t digest = digest_base[t.publisher_index] +
                      static_cast<uint32_t>(t.src_offset / welcome.segment_bytes);
    // offset + nbytes was proven not to overflow, so neither can any partial sum below.
    for (uint64_t done = 0; done < t.nbytes; done += welcome.segment_bytes) {
      Segment s;
      s.region = p.region;
      s.src_offset = p.offset + t.src_offset + done;
      s.destination = t.destination;
      s.dst_offset = t.dst_offset + done;
      s.shadow_offset = t.shadow_offset + done;
      s.bytes = std::min(welcome.segment_bytes, t.nbytes - done);
      s.digest_index = digest++;
      s.converted = t.transform != Transform::kCopy;
      s.landing_offset = t.landing_offset + done;
      plan->segments.push_back(s);
    }
    t.segment_count = static_cast<uint32_t>(plan->segments.size()) - t.first_segment;
  }
}

uint64_t DigestBases(const wire::Welcome& welcome, std::vector<uint32_t>* digest_base) {
  digest_base->resize(welcome.tensors.size());
  uint64_t count = 0;
  for (size_t i = 0; i < welcome.tensors.size(); ++i) {
    (*digest_base)[i] = static_cast<uint32_t>(count);  // ≤ kMaxDigests, checked by the layout
    count += SegmentCount(welcome.tensors[i].spec.nbytes, welcome.segment_bytes);
  }
  return count;
}

void GroupBuckets(uint64_t bucket_bytes, Plan* plan) {
  Bucket current;
  for (uint32_t i = 0; i < plan->segments.size(); ++i) {
    const uint64_t bytes = plan->segments[i].bytes;
    uint64_t grown = 0;
    const bool too_big =
        __builtin_add_overflow(current.bytes, bytes, &grown) || grown > bucket_bytes;
    if (current.segment_count > 0 && too_big) {
      plan->buckets.push_back(current);
      current = Bucket{};
    }
    if (current.segment_count == 0) current.first_segment = i;
    ++current.segment_count;
    current.bytes += bytes;  // cannot overflow: a fresh bucket, or `grown` was computed cleanly
  }
  if (current.segment_count > 0) plan->buckets.push_back(current);
}

Result<Plan> BuildPlan(const wire::Welcome& welcome, const std::vector<Destination>& destinations,
                       MatchPolicy policy, uint64_t bucket_bytes, const ConvertOptions& convert) {
  // Checked again although it is a documented precondition: the offsets below feed raw copies,
  // and re-validating once per handle costs microseconds.
  WS_RETURN_IF_ERROR(ValidateLayout(welcome));
  if (destinations.size() > kMaxTensors) {
    return Status::InvalidArgument("plan: ", destinations.size(), " destinations exceed the limit ",
                                   kMaxTensors);
  }

  MismatchList mismatches("publisher and subscriber manifests");
  // Name → first destination with that name. Duplicates are reported in subscriber order below.
  std::unordered_map<std::string_view, uint32_t> by_name;
  by_name.reserve(destinations.size());
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    by_name.emplace(destinations[d].spec.name, d);
  }

  Plan plan;
  std::vector<bool> matched(destinations.size(), false);
  std::vector<bool> published_into(destinations.size(), false);
  std::vector<uint32_t> scale_of(destinations.size(), kNoDestination);  // publisher index
  // Digest indices run over every publisher tensor, matched or not: the publisher hashes all of
  // them and StepEnd carries them in its manifest order.
  std::vector<uint32_t> digest_base(welcome.tensors.size());
  uint64_t digest_count = 0;
  uint64_t shadow_end = 0;
  uint64_t segment_count = 0;
  for (uint32_t i = 0; i < welcome.tensors.size(); ++i) {
    const wire::TensorPlacement& p = welcome.tensors[i];
    const TensorSpec& src = p.spec;
    digest_base[i] = static_cast<uint32_t>(digest_count);  // ≤ kMaxDigests, checked by layout
    digest_count += SegmentCount(src.nbytes, welcome.segment_bytes);

    auto it = by_name.find(src.name);
    if (it == by_name.end()) {
      if (policy == MatchPolicy::kStrict) {
        mismatches.Add("tensor '", src.name,
                       "': published but not registered by subscriber (strict policy)");
      }
      continue;
    }
    const uint32_t d = it->second;
    const TensorSpec& dst = destinations[d].spec;
    matched[d] = true;
    if (destinations[d].alias_of != kNoDestination) {
      // Written through the tensor it aliases; only checked against what is published here.
      published_into[destinations[d].alias_of] = true;
      if (src.dtype != dst.dtype || src.shape != dst.shape) {
        mismatches.Add("tensor '", src.name, "': publisher ", DTypeName(src.dtype), " ",
                       ShapeString(src.shape), ", subscriber ", DTypeName(dst.dtype), " ",
                       ShapeString(dst.shape), " (tied to '",
                       destinations[destinations[d].alias_of].spec.name, "')");
      }
      continue;
    }
    published_into[d] = true;
    PlannedTensor t;
    t.publisher_index = i;
    t.destination = d;
    t.nbytes = src.nbytes;
    t.from = src.dtype;
    t.to = dst.dtype;
    bool same = true;
    const Transform block_scaled = BlockScaledTransform(destinations[d].quantization);
    if (block_scaled != Transform::kCopy && !convert.enabled) {
      mismatches.Add("tensor '", src.name, "': ", TransformName(block_scaled),
                     " needs SubscriberOptions.convert_dtypes");
      same = false;
    } else if (block_scaled != Transform::kCopy) {
      t.transform = block_scaled;  // PlanBlockScaled checks the dtypes
    } else if (src.dtype != dst.dtype) {
      t.transform = TransformFor(src.dtype, dst.dtype);
      if (!convert.enabled || t.transform == Transform::kCopy) {
        mismatches.Add("tensor '", src.name, "': dtype mismatch: publisher ", DTypeName(src.dtype),
                       ", subscriber ", DTypeName(dst.dtype),
                       t.transform != Transform::kCopy
                           ? " (convertible in flight: enable SubscriberOptions.convert_dtypes)"
                           : "");
        t.transform = Transform::kCopy;
        same = false;
      }
    }
    if (src.shape != dst.shape) {
      mismatches.Add("tensor '", src.name, "': shape mismatch: publisher ", ShapeString(src.shape),
                     ", subscriber ", ShapeString(dst.shape));
      same = false;
    }
    // Same dtype and shape imply the same size unless one side computed nbytes wrongly; the
    // copy trusts both sizes, so a disagreement must stop here rather than overrun a buffer.
    // A conversion checks both sizes against the element count instead.
    if (same) {
      Status sizes = t.transform == Transform::kCopy
                         ? (src.nbytes == dst.nbytes
                                ? Status::Ok()
                                : Status::InvalidArgument("byte size mismatch: publisher ",
                                                          src.nbytes, ", subscriber ", dst.nbytes))
                         : PlanConversion(src, destinations, by_name, convert, &t);
      if (!sizes.ok()) mismatches.Add("tensor '", src.name, "': ", sizes.message());
      // The scale tensors found are claimed even when one of them is wrong: that problem is
      // listed above, not again as "registered but not published" (a problem found before the
      // scale tensors were looked up, such as the dtypes, leaves them unclaimed).
      for (uint32_t aux : {t.scale_destination, t.global_scale_destination}) {
        if (aux == kNoDestination) continue;
        matched[aux] = true;
        // An alias is the memory of the tensor it aliases: that one is what gets written.
        if (destinations[aux].alias_of != kNoDestination) aux = destinations[aux].alias_of;
        if (scale_of[aux] != kNoDestination) {
          mismatches.Add("tensor '", destinations[aux].spec.name,
                         "': receives the scales of two tensors");
        }
        scale_of[aux] = i;
      }
    }
    // Round shadow_end up to kShadowAlignment, then reserve nbytes, both overflow-checked: the
    // Welcome may place many large direct tensors over the same bytes.
    uint64_t aligned = 0;
    if (__builtin_add_overflow(shadow_end, kShadowAlignment - 1, &aligned) ||
        __builtin_add_overflow(aligned & ~(kShadowAlignment - 1), src.nbytes, &shadow_end) ||
        __builtin_add_overflow(plan.total_bytes, src.nbytes, &plan.total_bytes)) {
      return Status::ProtocolError("plan: matched tensors up to '", src.name,
                                   "' total more than 2^64 bytes");
    }
    t.shadow_offset = aligned & ~(kShadowAlignment - 1);
    segment_count += SegmentCount(src.nbytes, welcome.segment_bytes);
    if (p.region == wire::Region::kSlot) plan.uses_slots = true;
    if (p.region == wire::Region::kDirect) plan.uses_direct = true;
    plan.tensors.push_back(t);
  }

  // Subscriber-side problems, in subscriber order.
  for (uint32_t d = 0; d < destinations.size(); ++d) {
    if (published_into[d] && scale_of[d] != kNoDestination) {
      mismatches.Add("tensor '", destinations[d].spec.name,
                     "': published, but it is also where "
                     "the scales of '",
                     welcome.tensors[scale_of[d]].spec.name, "' go");
    }
    if (matched[d] || destinations[d].alias_of != kNoDestination) continue;
    const std::string& name = destinations[d].spec.name;
    const uint32_t first = by_name.at(name);
    if (first != d) {
      mismatches.Add("tensor '", name, "': registered twice by subscriber (destinations ", first,
                     " and ", d, ")");
    } else {
      mismatches.Add("tensor '", name, "': registered by subscriber but not published");
    }
  }
  if (!mismatches.empty()) return mismatches.ToStatus();

  plan.digest_count = static_cast<uint32_t>(digest_count);
  plan.shadow_bytes = shadow_end;
  // In place, converted tensors land in a buffer of their own (packed like the shadow): the
  // published bytes must be whole and verified before the transform writes the destination.
  for (uint32_t k = 0; k < plan.tensors.size(); ++k) {
    PlannedTensor& t = plan.tensors[k];
    if (t.transform == Transform::kCopy) continue;
    plan.converted.push_back(k);
    t.landing_offset = AlignUp(plan.landing_bytes);
    plan.landing_bytes = t.landing_offset + t.nbytes;  // ≤ shadow_bytes: no overflow
  }
  plan.destination_count = static_cast<uint32_t>(plan.tensors.size());
  plan.segments.reserve(segment_count);
  CutSegments(welcome, digest_base, &plan);
  GroupBuckets(bucket_bytes, &plan);
  return plan;
}

}  // namespace weightsync::plan
