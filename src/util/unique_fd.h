// UniqueFd: owns a file descriptor, counted in the ledger. Close() reports errno.
#pragma once

#include <utility>

#include "weightsync/status.h"

namespace weightsync::util {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd);  // takes ownership (fd < 0 means none)
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();  // caller owns it now (ledger adjusted)
  Status Close();

 private:
  int fd_ = -1;
};

}  // namespace weightsync::util
