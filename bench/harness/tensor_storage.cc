#include "harness/tensor_storage.h"

namespace weightsync::bench {

TensorStorage::TensorStorage(const std::vector<TensorSpec>& tensors, uint8_t fill)
    : tensors_(&tensors) {
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    offsets_.push_back(offset);
    offset = (offset + t.nbytes + 63) / 64 * 64;
  }
  // Over-allocate so the base can be aligned; value-initialization touches every page now, not
  // inside a measured update.
  buffer_.assign(offset + 64, fill);
  uint64_t misalign = reinterpret_cast<uintptr_t>(buffer_.data()) % 64;
  uint64_t shift = misalign ? 64 - misalign : 0;
  for (auto& o : offsets_) o += shift;
}

std::vector<NamedTensor> TensorStorage::Views() const {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < offsets_.size(); ++i) {
    const TensorSpec& s = (*tensors_)[i];
    NamedTensor t;  // field by field: TensorView's later fields keep their defaults (CPU)
    t.name = s.name;
    t.view.data = const_cast<uint8_t*>(data(i));
    t.view.dtype = s.dtype;
    t.view.shape = s.shape;
    out.push_back(std::move(t));
  }
  return out;
}

uint64_t TotalBytes(const std::vector<TensorSpec>& specs) {
  uint64_t total = 0;
  for (const auto& s : specs) total += s.nbytes;
  return total;
}

}  // namespace weightsync::bench
