// The last steps of building a plan, shared by BuildPlan (whole tensors) and BuildRegionPlan.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "wire/messages.h"

namespace weightsync::plan {

// Cuts every planned tensor into segments of at most `segment_bytes`, starting where the planned
// tensor starts. `digest_base[i]` is the first digest index of publisher tensor i.
void CutSegments(const wire::Welcome& welcome, const std::vector<uint32_t>& digest_base,
                 Plan* plan);

// Groups consecutive segments (across tensor boundaries, so runs of small tensors such as biases
// and norms share a bucket) until the next segment would push a bucket past `bucket_bytes`.
void GroupBuckets(uint64_t bucket_bytes, Plan* plan);

// Digest indices of each publisher tensor, as StepEnd numbers them: `digest_base` gets the first
// of each tensor; returns the total.
uint64_t DigestBases(const wire::Welcome& welcome, std::vector<uint32_t>* digest_base);

}  // namespace weightsync::plan
