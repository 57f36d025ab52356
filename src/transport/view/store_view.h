// StoreView: the subscriber's view of the publisher's store, built from the Welcome and the fds
// that came with it — describing where a version's bytes lie apart from moving them (NIXL's split
// between memory registration and transfer). A step delivers its bytes in *units*:
//  * an arena's slot (the publisher's StepBegin says which of `slot_count`),
//  * a zero-copy publisher's tensors (one unit: the same memory for every version),
//  * a ring's buckets (`version_buckets` units, streamed through the ring one by one).
// A view cuts the version's byte ranges into the pieces each unit holds, as they lie in this
// process, and runs a step's units in order — owning the ring's handshake (ring_bucket_ready /
// ring_bucket_done). Data paths prepare their copies from a view's pieces once and run a step
// through it: no path asks which store it reads. Each view is made by one of the two makers
// below, from host memory (a memfd) or GPU memory (cuMem, CUDA IPC).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transport/link/link.h"
#include "util/deadline.h"
#include "util/function_ref.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::view {

// `bytes` of what was cut, `at` bytes into it, lying at `src` in this process. `span`: which
// piece of memory it lies in (a zero-copy publisher's allocation; 0 for a single arena or ring):
// copy batches fold rows within one span only (cuda/copy_batch.h).
struct Piece {
  uint64_t at = 0;
  const uint8_t* src = nullptr;
  uint64_t bytes = 0;
  uint32_t span = 0;
};

class StoreView {
 public:
  virtual ~StoreView() = default;

  // How many units a path prepares for (a copy batch each, say).
  virtual uint32_t units() const = 0;
  // Whether a unit is gone (its ring slot refilled) before the step ends: whatever reads the
  // store must read a unit while Step is on it.
  virtual bool streamed() const { return false; }
  // Appends to `out` the pieces of the version's bytes [offset, offset + bytes) of `region` that
  // unit `unit` holds, in order, each at most `max_piece` bytes (0: uncut). The range lies inside
  // its tensor (plan::ValidateLayout). Nothing for a range the unit does not hold (a ring's
  // other buckets).
  virtual void Cut(uint32_t unit, wire::Region region, uint64_t offset, uint64_t bytes,
                   uint64_t max_piece, std::vector<Piece>* out) const = 0;
  // Where unit `unit`'s slot region starts when it is one contiguous range that stays until the
  // step ends (an arena's slot), so a segment's bytes are there at its src_offset; null otherwise
  // (a zero-copy publisher's allocations, a streamed ring).
  virtual const uint8_t* SlotBase(uint32_t /*unit*/) const { return nullptr; }
  // Runs step `begin`'s units in order: read(unit) for the StepBegin's slot, for the tensors' one
  // unit, or for each of a ring's buckets once the publisher announces it (answered once read
  // returns: the slot is refilled after). The first error ends it.
  virtual Status Step(const wire::StepBegin& begin, const util::Deadline& deadline,
                      util::FunctionRef<Status(uint32_t unit)> read) = 0;

  // A view of host memory: what is mapped (a path pins it for the copy engines). Empty for GPU
  // memory.
  virtual std::span<const uint8_t> host_memory() const { return {}; }
  // A view of GPU memory: the device holding it (-1 when the driver does not say, or for memory
  // opened by IPC handle), and access to it from another device.
  virtual int owner_device() const { return -1; }
  virtual Status GrantAccess(int device) {
    return Status::NotSupported("this store's memory cannot be granted to cuda:", device);
  }

  // ", GPU arena on cuda:0", ", a ring of 2 host buckets of ... (21 a version)": the prepare log.
  virtual std::string Describe() const = 0;
  // Unmaps or closes what the view holds. Idempotent; each failure logged, the rest released.
  virtual Status Release() = 0;
};

// A store in host memory (a host arena or ring), mapped read-only from `fd` (taken and closed once
// mapped). `link`: the control connection a ring's buckets are announced on (outlives the view;
// may be null for an arena, whose steps need none).
Result<std::unique_ptr<StoreView>> MapHostStore(const wire::Welcome& welcome, util::UniqueFd fd,
                                                link::Link* link);

// A store in GPU memory: a GPU arena or ring imported from `fd` for `device` (taken); or a
// zero-copy publisher's own allocations, opened by IPC handle or imported from
// `allocation_fds` (one per cuMem chunk, each closed once imported) for `device`.
Result<std::unique_ptr<StoreView>> ImportGpuStore(const wire::Welcome& welcome, util::UniqueFd fd,
                                                  std::vector<util::UniqueFd>* allocation_fds,
                                                  int device, link::Link* link);

}  // namespace weightsync::transport::view
