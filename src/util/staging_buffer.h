// StagingBuffer: page-aligned anonymous memory for shadow copies, returned to the OS on Close()
// (not kept in the malloc heap), counted in the ledger as staging bytes.
#pragma once

#include <cstdint>
#include <utility>

#include "weightsync/status.h"

namespace weightsync::util {

class StagingBuffer {
 public:
  StagingBuffer() = default;
  static Result<StagingBuffer> Allocate(uint64_t bytes);
  StagingBuffer(StagingBuffer&& o) noexcept { *this = std::move(o); }
  StagingBuffer& operator=(StagingBuffer&& o) noexcept;
  ~StagingBuffer();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  Status Close();

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace weightsync::util
