// libFuzzer target: the segment-delta checker and applier (src/delta/segment_delta.h), which read
// bytes a publisher sent before any digest is checked.
//
// Input: one byte choosing the element size (1, 2, 4, 8, 16 or 3), two bytes of element count
// (little endian, at most 4096), then the delta. Properties checked besides "no sanitizer report":
//   - CheckDelta fails only with ProtocolError, and ApplyDelta fails exactly when it does;
//   - a refused delta leaves the segment untouched;
//   - an accepted delta changes at most the elements it carries;
//   - the encoder, given the base and the result, writes a delta that is never larger than the
//     input (its choice per chunk is the cheapest) and that gives the same result.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "delta/segment_delta.h"
#include "fuzz_check.h"

using weightsync::StatusCode;
namespace delta = weightsync::delta;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  static constexpr uint32_t kSizes[] = {1, 2, 4, 8, 16, 3};
  const uint32_t element_bytes = kSizes[data[0] % 6];
  const uint64_t elements = (data[1] | (uint64_t{data[2]} << 8)) % 4097;
  const std::span<const uint8_t> input(data + 3, size - 3);

  std::vector<uint8_t> base(elements * element_bytes);
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<uint8_t> segment = base;

  const auto shape = delta::CheckDelta(input, segment.size(), element_bytes);
  const auto applied = delta::ApplyDelta(input, element_bytes, segment);
  WS_FUZZ_CHECK(shape.ok() == applied.ok(), "check %s, apply %s", shape.status().ToString().c_str(),
                applied.ToString().c_str());
  if (!shape.ok()) {
    WS_FUZZ_CHECK(shape.status().code() == StatusCode::kProtocolError, "%s",
                  shape.status().ToString().c_str());
    WS_FUZZ_CHECK(segment == base, "a refused delta wrote bytes");
    return 0;
  }
  uint64_t differing = 0;
  for (uint64_t e = 0; e < elements; ++e) {
    differing +=
        std::memcmp(&segment[e * element_bytes], &base[e * element_bytes], element_bytes) != 0;
  }
  WS_FUZZ_CHECK(differing <= shape->changed_elements, "%llu elements changed, %llu carried",
                static_cast<unsigned long long>(differing),
                static_cast<unsigned long long>(shape->changed_elements));

  delta::SegmentEncoder encoder;
  std::vector<uint8_t> out(input.size());
  const auto encoded = encoder.Encode(base, segment, element_bytes, out);
  WS_FUZZ_CHECK(encoded.has_value(), "the encoder found no delta within %zu bytes", input.size());
  WS_FUZZ_CHECK(encoded->changed_elements == differing, "encoder counted %llu, %llu differ",
                static_cast<unsigned long long>(encoded->changed_elements),
                static_cast<unsigned long long>(differing));
  std::vector<uint8_t> again = base;
  const auto reapplied =
      delta::ApplyDelta(std::span(out).first(encoded->bytes), element_bytes, again);
  WS_FUZZ_CHECK(reapplied.ok(), "%s", reapplied.ToString().c_str());
  WS_FUZZ_CHECK(again == segment, "the re-encoded delta gives other bytes");
  return 0;
}
