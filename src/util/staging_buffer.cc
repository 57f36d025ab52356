#include "util/staging_buffer.h"

#include <sys/mman.h>

#include <cerrno>

#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::util {

Result<StagingBuffer> StagingBuffer::Allocate(uint64_t bytes) {
  StagingBuffer b;
  if (bytes == 0) return b;
  // Populated now: the staging pages are part of what a handle prepares once.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(errno,
                             "allocating a staging buffer of " + std::to_string(bytes) + " bytes");
  }
  b.data_ = static_cast<uint8_t*>(p);
  b.size_ = bytes;
  LedgerAdd(LedgerItem::kStagingBytes, static_cast<int64_t>(bytes));
  return b;
}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "staging") << "cleanup: " << s;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

StagingBuffer::~StagingBuffer() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "staging") << "cleanup: " << s;
}

Status StagingBuffer::Close() {
  if (data_ == nullptr) return Status::Ok();
  uint8_t* p = std::exchange(data_, nullptr);
  uint64_t n = std::exchange(size_, 0);
  LedgerAdd(LedgerItem::kStagingBytes, -static_cast<int64_t>(n));
  if (::munmap(p, n) != 0) {
    LedgerAdd(LedgerItem::kReleaseFailures, 1);
    return Status::FromErrno(errno, "munmap staging buffer of " + std::to_string(n) + " bytes");
  }
  return Status::Ok();
}

}  // namespace weightsync::util
