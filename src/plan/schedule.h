// The static schedule of a subscriber fed by several publishers (e.g. one per trainer rank, each
// owning part of the model): which publisher delivers each destination tensor. Decided once per
// prepare, before any transfer handle is prepared, so every byte has exactly one source and the
// sources' links carry their shares concurrently.
//
// Rules:
//  - a tensor held by one publisher comes from it;
//  - a tensor held by several (replicated parameters, e.g. norms under tensor parallelism) goes to
//    the one with the fewest bytes assigned so far, largest tensors first, so the shares balance;
//    ties go to the publisher listed first, so the schedule is deterministic;
//  - strict policy: every published name must be registered and every registered name published
//    by at least one; subset policy: only the latter;
//  - every holder of a registered tensor must agree with the destination on dtype and shape;
//  - a destination tied to another (Destination::alias_of) goes with that one and moves nothing.
// One InvalidArgument lists every problem found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::plan {

struct SourceManifest {
  std::string name;                        // how errors name it, e.g. "local://rank0"
  const wire::Welcome* welcome = nullptr;  // its manifest (tensors), validated by ValidateLayout
};

struct Schedule {
  // Per source, the indices into `destinations` it delivers, ascending. May be empty.
  std::vector<std::vector<uint32_t>> destinations;
  std::vector<uint64_t> bytes;  // per source, published bytes it sends per step
};

// With `convert` enabled, a dtype difference a Transform covers is not a problem, and an fp8
// scale destination (NAME + scale_suffix, published by nobody) goes with its tensor NAME.
Result<Schedule> AssignSources(const std::vector<SourceManifest>& sources,
                               const std::vector<Destination>& destinations, MatchPolicy policy,
                               const ConvertOptions& convert = {});

}  // namespace weightsync::plan
