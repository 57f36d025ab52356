// Shared-memory building blocks: an anonymous memfd segment (owner-only by construction, sealed
// against resizing so a peer's mapping can never SIGBUS) and an RAII mapping. Both are counted in
// the ledger; Close() reports errno and names the segment.
#pragma once

#include <cstdint>
#include <string>

#include "util/unique_fd.h"
#include "weightsync/status.h"

namespace weightsync::transport::store {

class Mapping {
 public:
  Mapping() = default;
  // Maps `bytes` of `fd` shared; read-only unless `writable`. `what` names it in errors.
  static Result<Mapping> Map(int fd, uint64_t bytes, bool writable, std::string what);
  Mapping(Mapping&& o) noexcept { *this = std::move(o); }
  Mapping& operator=(Mapping&& o) noexcept;
  ~Mapping();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  Status Close();  // munmap

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string what_;
};

class ShmSegment {
 public:
  ShmSegment() = default;
  // memfd of `bytes`, sealed against shrink/grow. Fails with ResourceExhausted if memory is short.
  static Result<ShmSegment> Create(const std::string& name, uint64_t bytes);
  ShmSegment(ShmSegment&&) noexcept = default;
  ShmSegment& operator=(ShmSegment&&) noexcept = default;
  ~ShmSegment();

  int fd() const { return fd_.get(); }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  Status Close();

 private:
  util::UniqueFd fd_;
  uint64_t size_ = 0;
  std::string name_;
  bool counted_ = false;
};

// Checks an fd received from a peer before mapping it: a memfd whose size equals
// `expected_bytes` and which is sealed against shrinking (otherwise the peer could truncate it
// under our mapping). ProtocolError names what differs.
Status CheckImportedSegment(int fd, uint64_t expected_bytes);

}  // namespace weightsync::transport::store
