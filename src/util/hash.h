// Digests: xxHash3 (libxxhash), fast enough to verify every byte of an update.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weightsync::util {

uint64_t Hash64(const void* data, size_t bytes);

// memcpy(dst, src, bytes), returning Hash64(dst, bytes): one pass over memory — each chunk is
// hashed right after it is copied, while it is still in cache — instead of a copy and then a
// second read of everything.
uint64_t CopyAndHash64(void* dst, const void* src, size_t bytes);

// Hash64 of a range fed in pieces, in order: Finish() == Hash64 of the concatenation. The state
// lives here (no allocation); Reset before each range.
class Hash64Stream {
 public:
  Hash64Stream();
  void Reset();
  void Update(const void* data, size_t bytes);
  uint64_t Finish() const;

 private:
  alignas(64) unsigned char state_[640];  // an XXH3_state_t (hash.cc checks that it fits)
};

}  // namespace weightsync::util
