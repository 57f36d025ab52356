#include "transport/store/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::transport::store {

using util::LedgerAdd;
using util::LedgerItem;

Result<Mapping> Mapping::Map(int fd, uint64_t bytes, bool writable, std::string what) {
  Mapping m;
  m.what_ = std::move(what);
  if (bytes == 0) return m;
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  // MAP_POPULATE: fault the page tables in now, at prepare time, not during the first step's copy.
  void* p = ::mmap(nullptr, bytes, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap " + m.what_);
  m.data_ = static_cast<uint8_t*>(p);
  m.size_ = bytes;
  LedgerAdd(LedgerItem::kMappings, 1);
  LedgerAdd(LedgerItem::kMappedBytes, static_cast<int64_t>(bytes));
  return m;
}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "shm") << "cleanup: " << s;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    what_ = std::move(o.what_);
  }
  return *this;
}

Mapping::~Mapping() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "shm") << "cleanup: " << s;
}

Status Mapping::Close() {
  if (data_ == nullptr) return Status::Ok();
  uint8_t* p = std::exchange(data_, nullptr);
  uint64_t n = std::exchange(size_, 0);
  LedgerAdd(LedgerItem::kMappings, -1);
  LedgerAdd(LedgerItem::kMappedBytes, -static_cast<int64_t>(n));
  int rc = ::munmap(p, n);
  int err = errno;
  if (util::FailPoints::Check("shm.munmap").action == util::FailAction::kError) {
    rc = -1;
    err = EINVAL;
  }
  if (rc != 0) {
    LedgerAdd(LedgerItem::kReleaseFailures, 1);
    return Status::FromErrno(err, "munmap " + what_);
  }
  return Status::Ok();
}

Result<ShmSegment> ShmSegment::Create(const std::string& name, uint64_t bytes) {
  ShmSegment s;
  s.name_ = name;
  int fd = ::memfd_create(("weightsync:" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create '" + name + "'");
  s.fd_ = util::UniqueFd(fd);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno(
        errno, "ftruncate segment '" + name + "' to " + std::to_string(bytes) + " bytes");
  }
  // Reserve the pages now so a short /dev/shm fails here, not with SIGBUS mid-copy.
  if (bytes > 0) {
    int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      return Status::FromErrno(
          err, "allocating " + std::to_string(bytes) + " bytes for segment '" + name + "'");
    }
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno(errno, "sealing segment '" + name + "'");
  }
  s.size_ = bytes;
  s.counted_ = true;
  LedgerAdd(LedgerItem::kSegments, 1);
  return s;
}

ShmSegment::~ShmSegment() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "shm") << "cleanup: " << s;
}

Status ShmSegment::Close() {
  if (counted_) {
    counted_ = false;
    LedgerAdd(LedgerItem::kSegments, -1);
  }
  Status s = fd_.Close();
  if (!s.ok()) return s.WithContext("segment '" + name_ + "'");
  return s;
}

Status CheckImportedSegment(int fd, uint64_t expected_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat of received segment");
  if (!S_ISREG(st.st_mode)) {
    return Status::ProtocolError("received segment fd is not a memory file (mode ", std::oct,
                                 st.st_mode, ")");
  }
  if (static_cast<uint64_t>(st.st_size) != expected_bytes) {
    return Status::ProtocolError("received segment is ", st.st_size, " bytes, welcome says ",
                                 expected_bytes);
  }
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    return Status::ProtocolError("received segment is not sealed against shrinking");
  }
  return Status::Ok();
}

}  // namespace weightsync::transport::store
