#include "weightsync/tensor_view.h"

#include <sstream>

namespace weightsync {

Result<uint64_t> TensorView::NumElements() const {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return Status::InvalidArgument("negative dimension in shape ", ShapeString(shape));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return Status::InvalidArgument("element count of shape ", ShapeString(shape),
                                     " overflows 64 bits");
    }
  }
  return n;
}

Result<uint64_t> TensorView::NumBytes() const {
  WS_ASSIGN_OR_RETURN(uint64_t n, NumElements());
  return ByteSize(dtype, n);
}

std::string DeviceString(const Device& device) {
  return device.is_cuda() ? "cuda:" + std::to_string(device.index) : std::string("cpu");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

}  // namespace weightsync
