#include "transport/link/endpoint_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::transport::link {
namespace {

// Each retry means an owner released the endpoint in the microseconds between our open() and
// our flock(); several in a row mean publishers are churning on this endpoint, and the caller
// should hear about it rather than spin.
constexpr int kMaxLockAttempts = 8;

}  // namespace

Result<std::unique_ptr<EndpointLock>> EndpointLock::Acquire(const Endpoint& endpoint) {
  const std::string& path = endpoint.lock_path;
  for (int attempt = 0; attempt < kMaxLockAttempts; ++attempt) {
    // Mode 0600 is owner-only whatever the umask (a umask only clears bits), so unlike the
    // socket's bind() this needs no process-wide umask change. O_RDONLY: flock needs no write
    // access, and a file left by a crashed owner stays openable.
    util::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::FromErrno(errno, "open lock file '" + path + "'");
    // Tests widen the window between open() and flock() here to stage the lock-file race below.
    (void)util::FailPoints::Check("shm.lock_file_opened");
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return Status::AlreadyExists("endpoint ", endpoint.ToString(),
                                     " is already served by a live publisher (",
                                     endpoint.socket_path, ")");
      }
      return Status::FromErrno(errno, "flock lock file '" + path + "'");
    }
    // The classic lock-file race: the previous owner may have unlinked this file (its Release)
    // between our open() and our flock(), and a successor may since have created and locked a new
    // one. A lock on a file the path no longer names owns nothing; look at the path again.
    struct stat held;
    if (::fstat(fd.get(), &held) != 0) {
      return Status::FromErrno(errno, "fstat lock file '" + path + "'");
    }
    struct stat named;
    if (::stat(path.c_str(), &named) != 0) {
      if (errno == ENOENT) continue;
      return Status::FromErrno(errno, "stat lock file '" + path + "'");
    }
    if (held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      return std::unique_ptr<EndpointLock>(new EndpointLock(path, std::move(fd)));
    }
  }
  return Status::FailedPrecondition("endpoint ", endpoint.ToString(), ": lock file '", path,
                                    "' was replaced under each of ", kMaxLockAttempts,
                                    " attempts to lock it (publishers starting and stopping on "
                                    "this endpoint?); try again");
}

EndpointLock::~EndpointLock() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "shm") << "endpoint lock cleanup: " << s;
}

Status EndpointLock::Release() {
  if (!fd_.valid()) return Status::Ok();
  Status result;
  int rc = ::unlink(path_.c_str());
  int err = errno;
  if (util::FailPoints::Check("shm.unlink_lock_file").action == util::FailAction::kError) {
    rc = -1;
    err = EACCES;
  }
  if (rc != 0 && err != ENOENT) {
    util::LedgerAdd(util::LedgerItem::kReleaseFailures, 1);
    Status s = Status::FromErrno(err, "unlink lock file '" + path_ + "'");
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  if (Status s = fd_.Close(); !s.ok()) {
    Status named = s.WithContext("lock file '" + path_ + "'");
    WS_LOG(WARN, "shm") << "release: " << named;
    result.Update(named);
  }
  return result;
}

}  // namespace weightsync::transport::link
