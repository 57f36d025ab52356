// The weights check (Subscriber::CheckWeights): every source's handle digests the destinations it
// fills where they lie (transport/path/destination_check.h); this combines their answers per
// registered destination into a WeightsCheck, and one Corruption naming every destination whose
// memory differs from the committed version.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "transport/transport.h"
#include "util/deadline.h"
#include "weightsync/status.h"
#include "weightsync/update_stats.h"

namespace weightsync::core {

// One source's part of the check.
struct CheckedShare {
  transport::TransferHandle* handle = nullptr;
  const std::vector<plan::Destination>* destinations = nullptr;  // as the handle was prepared
  // Per destination of the share, its index among the registered ones; empty: the same list.
  std::span<const uint32_t> registered_index;
  std::span<const uint64_t> digests;  // the committed version's, from this source
};

// Checks every share (one after the other) against the committed `step`. `out` gets the counts
// whether or not something differs.
Status CheckWeights(std::span<const CheckedShare> shares,
                    const std::vector<plan::Destination>& registered, int64_t step,
                    const util::Deadline& deadline, WeightsCheck* out);

}  // namespace weightsync::core
