// The plan of one publisher's share of a region schedule (plan/regions.h): which runs of its
// tensors go where in the subscriber's destinations. Built once per transfer handle like BuildPlan,
// into the same Plan the data paths walk: each planned tensor is one contiguous run of a published
// tensor into one contiguous range of a destination (a region copy's rows become runs; runs that
// continue each other on both sides are merged).
//
// Verification checks whole publisher digest segments. A plan built `for_verify` receives any
// digest segment it needs only part of — or whose bytes go to several places — whole, as one
// kExtract tensor: verified, then its wanted pieces are copied out at commit (from the shadow
// when staged, from the landing buffer in place). Row-parallel (dim ≥ 1) slices read every
// segment in part, so verifying them moves the whole of each segment they touch. A plan built
// without it moves exactly the wanted bytes, and is `verifiable` only if those happen to be whole
// segments.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.h"
#include "plan/regions.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::plan {

// `copies`: this publisher's copies, RegionCopy::held indexing `welcome.tensors` and
// RegionCopy::destination indexing `destinations`. Every range is checked against both tensors'
// sizes (Internal if a schedule produced one outside them). Requires ValidateLayout(welcome).
Result<Plan> BuildRegionPlan(const wire::Welcome& welcome,
                             const std::vector<Destination>& destinations,
                             const std::vector<RegionCopy>& copies, uint64_t bucket_bytes,
                             bool for_verify);

}  // namespace weightsync::plan
