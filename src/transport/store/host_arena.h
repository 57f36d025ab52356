// HostArena: the publisher's shared-memory region, one memfd:
//   [direct region: arena-allocated tensors][slot 0][slot 1]...[slot N-1]
// The direct region grows while tensors are allocated (its addresses never move: the arena
// reserves address space up front and maps the memfd into it as it grows). Freeze() appends the
// slots, reserves their pages and seals the memfd against resizing; only then is its fd shared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "util/unique_fd.h"
#include "weightsync/status.h"

namespace weightsync::transport::store {

class HostArena {
 public:
  // Reserves `reserve_bytes` of address space (nothing is committed yet).
  static Result<std::unique_ptr<HostArena>> Create(const std::string& name, uint64_t reserve_bytes);
  ~HostArena();

  // Returns the offset of `bytes` zero-filled bytes (64-byte aligned) in the direct region.
  Result<uint64_t> AllocateDirect(uint64_t bytes);
  // Appends `slot_count` slots of `slot_bytes`, reserves their pages and seals the memfd.
  Status Freeze(uint64_t slot_bytes, uint32_t slot_count);

  uint8_t* base() const { return base_; }  // arena offset 0 (direct region start)
  uint8_t* slot(uint32_t k) const { return base_ + slots_offset_ + k * slot_bytes_; }
  uint64_t direct_bytes() const { return direct_used_; }
  uint64_t slots_offset() const { return slots_offset_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t arena_bytes() const { return mapped_; }
  bool frozen() const { return frozen_; }
  int fd() const { return fd_.get(); }
  Status Close();

 private:
  HostArena() = default;
  Status GrowTo(uint64_t bytes);

  std::string name_;
  util::UniqueFd fd_;
  uint8_t* base_ = nullptr;
  uint64_t reserved_ = 0;
  uint64_t mapped_ = 0;  // bytes of the memfd mapped at base_
  uint64_t direct_used_ = 0;
  uint64_t slots_offset_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t slot_count_ = 0;
  bool frozen_ = false;
};

}  // namespace weightsync::transport::store
