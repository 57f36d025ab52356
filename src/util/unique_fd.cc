#include "util/unique_fd.h"

#include <unistd.h>

#include <cerrno>

#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::util {

UniqueFd::UniqueFd(int fd) : fd_(fd) {
  if (fd_ >= 0) LedgerAdd(LedgerItem::kFds, 1);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "fd") << "cleanup: " << s;
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "fd") << "cleanup: " << s;
}

int UniqueFd::release() {
  if (fd_ >= 0) LedgerAdd(LedgerItem::kFds, -1);
  return std::exchange(fd_, -1);
}

Status UniqueFd::Close() {
  if (fd_ < 0) return Status::Ok();
  int fd = std::exchange(fd_, -1);
  LedgerAdd(LedgerItem::kFds, -1);
  // Linux closes the fd even when close() reports EINTR; never retry.
  if (::close(fd) != 0 && errno != EINTR) {
    LedgerAdd(LedgerItem::kReleaseFailures, 1);
    return Status::FromErrno(errno, "close(fd " + std::to_string(fd) + ")");
  }
  return Status::Ok();
}

}  // namespace weightsync::util
