// The fixed subscriber side the messages target plans a fuzzed Welcome against, shared with the
// corpus generator so that its seed Welcomes match it and the fuzzer starts from plans that build.
#pragma once

#include <cstdint>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/manifest.h"

namespace weightsync::fuzz {

// `specs` with nbytes filled the way Register() does (the lists below are valid by construction).
inline std::vector<TensorSpec> Sized(std::vector<TensorSpec> specs) {
  auto manifest = Manifest::Build(specs);
  return manifest.ok() ? manifest->tensors() : std::vector<TensorSpec>{};
}

// Small, but with the shapes that matter to byte arithmetic: a 2-D tensor, a 16-bit one, a packed
// float4 with an odd element count (ceil(n/2) bytes), a zero-element tensor and a 0-d scalar.
inline std::vector<TensorSpec> DestinationSpecs() {
  std::vector<TensorSpec> specs = {
      {"embed.weight", DType::kFloat32, {4, 8}, 0},
      {"layer.0.bias", DType::kBFloat16, {8}, 0},
      {"norm.q", DType::kFloat4E2M1FN, {5}, 0},
      {"empty", DType::kInt8, {0, 3}, 0},
      {"scalar", DType::kInt64, {}, 0},
  };
  return Sized(std::move(specs));
}

// The destination set planned with SubscriberOptions::convert_dtypes on: casts both ways, and
// bf16 → fp8 for a 2-D and a 1-D tensor with float32 and e8m0 scale destinations (partial
// 128-blocks). ConvertingPublisherSpecs is a publisher side that plans onto it.
inline std::vector<TensorSpec> ConvertingDestinationSpecs() {
  std::vector<TensorSpec> specs = {
      {"embed.weight", DType::kBFloat16, {4, 8}, 0},
      {"layer.0.bias", DType::kFloat32, {8}, 0},
      {"w8", DType::kFloat8E4M3FN, {3, 130}, 0},
      {"w8_scale_inv", DType::kFloat32, {1, 2}, 0},
      {"w8e", DType::kFloat8E4M3FN, {130}, 0},
      {"w8e_scale_inv", DType::kFloat8E8M0FNU, {1, 2}, 0},
      {"scalar", DType::kInt64, {}, 0},
  };
  return Sized(std::move(specs));
}

inline std::vector<TensorSpec> ConvertingPublisherSpecs() {
  std::vector<TensorSpec> specs = {
      {"embed.weight", DType::kFloat32, {4, 8}, 0},
      {"layer.0.bias", DType::kBFloat16, {8}, 0},
      {"w8", DType::kBFloat16, {3, 130}, 0},
      {"w8e", DType::kBFloat16, {130}, 0},
      {"scalar", DType::kInt64, {}, 0},
  };
  return Sized(std::move(specs));
}

}  // namespace weightsync::fuzz
