// The copies of a ring step (ArenaKind::kHostRing, kCudaRing) into a landing, for the paths whose
// copy engines move the bytes: one batch per bucket of the version, prepared once per handle.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/copy_batch.h"
#include "plan/plan.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

// Per bucket b of the version, the copies of every planned tensor's bytes in it (cut at bucket
// edges, plan/ring_cut.h), from ring slot b % slot_count at `ring` (this process's mapping of the
// publisher's ring: imported GPU memory or pinned host memory) into received(t) — where the
// landing receives tensor t. Each destination tensor is one span (cuda/copy_batch.h): sources are
// the one ring.
std::vector<cuda::CopyBatch> RingCopyBatches(
    const wire::Welcome& welcome, const plan::Plan& plan, const uint8_t* ring,
    const std::function<uint8_t*(const plan::PlannedTensor&)>& received);

// "a ring of 2 host buckets of 268435456 bytes (21 a version)": `kind` says where the ring is.
std::string RingText(const wire::Welcome& welcome, const char* kind);

}  // namespace weightsync::transport::path
