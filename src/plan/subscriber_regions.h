// A subscriber's region schedule (docs/regions.md): what every publisher's Welcome holds (its
// tensors, or shards of global tensors) intersected with what every destination wants (a whole
// tensor, or region parts of global tensors), once per prepare. The result is each publisher's
// share as the copies its transfer handle plans from (plan::BuildRegionPlan), so the subscriber
// core only hands them out.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "plan/regions.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::plan {

// Whether the subscriber needs a region schedule: some destination wants regions, or some
// publisher holds a shard.
bool UsesRegions(std::span<const wire::Welcome* const> welcomes,
                 const std::vector<Destination>& destinations);

struct SourceShares {
  // Per publisher, the copies it delivers; RegionCopy::held indexes that publisher's Welcome
  // tensors. Empty for a publisher that delivers nothing.
  std::vector<std::vector<RegionCopy>> copies;
  std::vector<uint64_t> bytes;  // per publisher, bytes it sends per step
  size_t total_copies = 0;
};

// `welcomes`: one per publisher, each validated (ValidateLayout). Strict policy: every published
// tensor must be wanted by some destination. `casts`: SubscriberOptions::convert_dtypes. One
// InvalidArgument lists every problem: unwanted published tensors, then ScheduleRegions'.
Result<SourceShares> ScheduleSubscriberRegions(std::span<const wire::Welcome* const> welcomes,
                                               const std::vector<Destination>& destinations,
                                               MatchPolicy policy, bool casts);

}  // namespace weightsync::plan
