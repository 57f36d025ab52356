#include "demo_tensors.h"

#include <cstdlib>

#include "cuda/device.h"
#include "harness/pattern.h"

namespace weightsync::tools {

Result<Device> ParseDemoDevice(const std::string& flag, const std::string& text) {
  Device d;
  if (text == "cpu") return d;
  d.kind = Device::Kind::kCUDA;
  if (text == "cuda") return d;
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    char* end = nullptr;
    long index = std::strtol(text.c_str() + 5, &end, 10);
    if (*end == '\0' && index >= 0 && index < 1024) {
      d.index = static_cast<int>(index);
      return d;
    }
  }
  return Status::InvalidArgument("--", flag, "=", text, ": expected cpu, cuda or cuda:N");
}

DemoTensors::DemoTensors(const std::vector<TensorSpec>& tensors, Device device, uint8_t fill)
    : tensors_(&tensors), device_(device), host_(tensors, fill) {}

Result<DemoTensors> DemoTensors::Create(const std::vector<TensorSpec>& tensors, Device device,
                                        uint8_t fill) {
  DemoTensors t(tensors, device, fill);
  if (!device.is_cuda()) return t;
  uint64_t total = 0;
  for (const TensorSpec& s : tensors) {
    t.offsets_.push_back(total);
    total += (s.nbytes + 255) / 256 * 256;  // cudaMalloc's own alignment for every tensor
  }
  Result<DeviceMemory> memory = DeviceMemory::Allocate(device.index, total);
  if (!memory.ok()) {
    return memory.status().WithContext("allocating the demo's tensors on " + DeviceString(device));
  }
  t.gpu_ = std::move(memory).value();
  if (fill != 0) {  // Allocate zero-fills; anything else is copied up from the host copy
    for (size_t i = 0; i < t.size(); ++i) {
      WS_RETURN_IF_ERROR(cuda::CopyToDevice(static_cast<uint8_t*>(t.gpu_.data()) + t.offsets_[i],
                                            t.host_.data(i), t.host_.bytes(i)));
    }
  }
  return t;
}

std::vector<NamedTensor> DemoTensors::Views() const {
  std::vector<NamedTensor> views = host_.Views();
  if (!device_.is_cuda()) return views;
  for (size_t i = 0; i < views.size(); ++i) {
    views[i].view.data = static_cast<uint8_t*>(gpu_.data()) + offsets_[i];
    views[i].view.device = device_;
  }
  return views;
}

Status DemoTensors::Fill(int64_t step) {
  for (size_t i = 0; i < size(); ++i) {
    bench::FillPattern(static_cast<uint32_t>(i), step, host_.data(i), host_.bytes(i));
    if (device_.is_cuda()) {
      WS_RETURN_IF_ERROR(cuda::CopyToDevice(static_cast<uint8_t*>(gpu_.data()) + offsets_[i],
                                            host_.data(i), host_.bytes(i)));
    }
  }
  return Status::Ok();
}

Result<size_t> DemoTensors::CountWrong(int64_t step, std::string* first_bad) {
  size_t bad = 0;
  for (size_t i = 0; i < size(); ++i) {
    const uint64_t n = host_.bytes(i);
    if (device_.is_cuda()) {
      WS_RETURN_IF_ERROR(
          cuda::CopyToHost(host_.data(i), static_cast<uint8_t*>(gpu_.data()) + offsets_[i], n));
    }
    if (bench::Digest(host_.data(i), n) !=
        bench::ExpectedDigest(static_cast<uint32_t>(i), step, n)) {
      if (bad++ == 0) *first_bad = (*tensors_)[i].name;
    }
  }
  return bad;
}

}  // namespace weightsync::tools
