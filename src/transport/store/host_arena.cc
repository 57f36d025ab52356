#include "transport/store/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "util/address_space.h"
#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::transport::store {

using util::LedgerAdd;
using util::LedgerItem;

namespace {
constexpr uint64_t kPage = 4096;
constexpr uint64_t kMinReserve = 64ull << 20;  // smallest reservation tried
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Under an address-space limit (RLIMIT_AS) a reservation that takes all the headroom leaves
// nothing for thread stacks and malloc, and the publisher then fails elsewhere for no clear
// reason. Reserve at most half of the headroom. No limit → no cap.
uint64_t CapToAddressSpaceHeadroom(uint64_t want) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return want;
  const uint64_t in_use = util::AddressSpaceInUse();
  const uint64_t headroom = limit.rlim_cur > in_use ? limit.rlim_cur - in_use : 0;
  return std::min(want, RoundUp(headroom / 2, kPage));
}
}  // namespace

Result<std::unique_ptr<HostArena>> HostArena::Create(const std::string& name,
                                                     uint64_t reserve_bytes) {
  std::unique_ptr<HostArena> a(new HostArena());
  a->name_ = name;
  int fd = ::memfd_create(("weightsync:" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create for arena '" + name + "'");
  a->fd_ = util::UniqueFd(fd);
  LedgerAdd(LedgerItem::kSegments, 1);
  // Address space only (PROT_NONE, MAP_NORESERVE): nothing is committed. Where a limit
  // (ulimit -v, a sanitizer's shadow layout) refuses the full reservation, try smaller ones: the
  // arena then fails later, clearly, only if the model does not fit.
  void* p = MAP_FAILED;
  int err = 0;
  const uint64_t first = CapToAddressSpaceHeadroom(RoundUp(reserve_bytes, kPage));
  for (uint64_t want = std::max<uint64_t>(first, kPage);; want = RoundUp(want / 4, kPage)) {
    p = ::mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      a->reserved_ = want;
      break;
    }
    err = errno;
    if (want / 4 < kMinReserve) break;
  }
  if (p == MAP_FAILED) {
    return Status::FromErrno(err, "reserving address space for arena '" + name + "'");
  }
  a->base_ = static_cast<uint8_t*>(p);
  LedgerAdd(LedgerItem::kMappings, 1);
  return a;
}

HostArena::~HostArena() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "shm") << "arena cleanup: " << s;
}

Status HostArena::GrowTo(uint64_t bytes) {
  bytes = RoundUp(bytes, kPage);
  if (bytes <= mapped_) return Status::Ok();
  if (bytes > reserved_) {
    return Status::ResourceExhausted("arena '", name_, "' needs ", bytes, " bytes, more than the ",
                                     reserved_,
                                     " bytes of address space this process could reserve");
  }
  if (::ftruncate(fd_.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno(errno, "growing arena '" + name_ + "' to " + std::to_string(bytes));
  }
  // Commit the pages now: a full /dev/shm fails here with a clear error, not as SIGBUS later.
  int err = ::posix_fallocate(fd_.get(), static_cast<off_t>(mapped_),
                              static_cast<off_t>(bytes - mapped_));
  if (err != 0) {
    return Status::FromErrno(err, "allocating " + std::to_string(bytes - mapped_) +
                                      " bytes of shared memory for arena '" + name_ + "'");
  }
  // MAP_POPULATE: the first Publish into a slot should not pay for page faults.
  void* p = ::mmap(base_ + mapped_, bytes - mapped_, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd_.get(), static_cast<off_t>(mapped_));
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mapping arena '" + name_ + "'");
  LedgerAdd(LedgerItem::kMappedBytes, static_cast<int64_t>(bytes - mapped_));
  mapped_ = bytes;
  return Status::Ok();
}

Result<uint64_t> HostArena::AllocateDirect(uint64_t bytes) {
  if (frozen_) {
    return Status::FailedPrecondition("arena '", name_, "': allocation after the first publish");
  }
  uint64_t offset = RoundUp(direct_used_, 64);
  uint64_t end;
  if (__builtin_add_overflow(offset, bytes, &end)) {
    return Status::InvalidArgument("arena allocation of ", bytes, " bytes overflows");
  }
  WS_RETURN_IF_ERROR(GrowTo(end));
  direct_used_ = end;
  return offset;
}

Status HostArena::Freeze(uint64_t slot_bytes, uint32_t slot_count) {
  // Sealed already (a Publish that froze the arena failed later and is retried): the same layout
  // is nothing to do; sealing twice would fail.
  if (frozen_) {
    if (slot_bytes_ == RoundUp(slot_bytes, kPage) && slot_count_ == slot_count) {
      return Status::Ok();
    }
    return Status::FailedPrecondition("arena '", name_, "' is sealed with ", slot_count_,
                                      " slots of ", slot_bytes_, " bytes");
  }
  slots_offset_ = RoundUp(direct_used_, kPage);
  slot_bytes_ = RoundUp(slot_bytes, kPage);
  uint64_t total;
  if (__builtin_mul_overflow(slot_bytes_, uint64_t{slot_count}, &total) ||
      __builtin_add_overflow(total, slots_offset_, &total)) {
    return Status::InvalidArgument("arena '", name_, "' size overflows");
  }
  WS_RETURN_IF_ERROR(GrowTo(total));
  if (::fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno(errno, "sealing arena '" + name_ + "'");
  }
  frozen_ = true;
  slot_count_ = slot_count;
  return Status::Ok();
}

Status HostArena::Close() {
  Status result;
  if (base_ != nullptr) {
    int rc = ::munmap(base_, reserved_);
    int err = errno;
    if (util::FailPoints::Check("shm.arena_munmap").action == util::FailAction::kError) {
      rc = -1;
      err = EINVAL;
    }
    base_ = nullptr;
    LedgerAdd(LedgerItem::kMappings, -1);
    LedgerAdd(LedgerItem::kMappedBytes, -static_cast<int64_t>(mapped_));
    mapped_ = 0;
    if (rc != 0) {
      LedgerAdd(LedgerItem::kReleaseFailures, 1);
      Status s = Status::FromErrno(err, "munmap arena '" + name_ + "'");
      WS_LOG(WARN, "shm") << "release: " << s;
      result.Update(s);
    }
  }
  if (fd_.valid()) {
    LedgerAdd(LedgerItem::kSegments, -1);
    if (Status s = fd_.Close(); !s.ok()) {
      WS_LOG(WARN, "shm") << "release: arena '" << name_ << "' fd: " << s;
      result.Update(s);
    }
  }
  return result;
}

}  // namespace weightsync::transport::store
