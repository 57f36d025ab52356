#include "core/weights_check.h"

#include <chrono>
#include <sstream>

namespace weightsync::core {

Status CheckWeights(std::span<const CheckedShare> shares,
                    const std::vector<plan::Destination>& registered, int64_t step,
                    const util::Deadline& deadline, WeightsCheck* out) {
  const auto t0 = std::chrono::steady_clock::now();
  *out = WeightsCheck{};
  out->step = step;
  std::vector<uint64_t> checked(registered.size(), 0);
  std::vector<uint8_t> unchecked(registered.size(), 0);
  std::vector<uint8_t> differs(registered.size(), 0);
  std::vector<transport::path::DestinationCheck::Difference> found;  // registered indices
  std::vector<uint64_t> share_checked;
  std::vector<uint8_t> share_unchecked;
  std::vector<transport::path::DestinationCheck::Difference> share_found;
  for (const CheckedShare& share : shares) {
    const size_t n = share.destinations->size();
    share_checked.assign(n, 0);
    share_unchecked.assign(n, 0);
    share_found.clear();
    WS_RETURN_IF_ERROR(share.handle->CheckDestinations(*share.destinations, share.digests, deadline,
                                                       share_checked, share_unchecked,
                                                       &share_found));
    auto at = [&](uint32_t d) {
      return share.registered_index.empty() ? d : share.registered_index[d];
    };
    for (uint32_t d = 0; d < n; ++d) {
      checked[at(d)] += share_checked[d];
      unchecked[at(d)] |= share_unchecked[d];
    }
    for (auto difference : share_found) {
      difference.destination = at(difference.destination);
      if (differs[difference.destination]) continue;  // named once, at its first difference
      differs[difference.destination] = 1;
      found.push_back(difference);
    }
  }
  for (size_t d = 0; d < registered.size(); ++d) {
    if (registered[d].alias_of != plan::kNoDestination) continue;  // its original's memory
    out->bytes += checked[d];
    if (!unchecked[d] && checked[d] == registered[d].spec.nbytes) {
      ++out->tensors;
    } else {
      ++out->unchecked_tensors;  // converted, extracted, or (partly) filled from part-segments
    }
  }
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (found.empty()) return Status::Ok();
  std::ostringstream message;
  message << "step " << step << ": the weights in memory differ from the committed version in "
          << found.size() << " of " << out->tensors + out->unchecked_tensors << " tensors:";
  constexpr size_t kNamed = 64;  // enough to see the pattern; the count says how many in all
  for (size_t i = 0; i < found.size() && i < kNamed; ++i) {
    const auto& f = found[i];
    message << (i ? "; " : " ") << "tensor '" << registered[f.destination].spec.name << "' bytes ["
            << f.offset << ", " << f.offset + f.bytes << ")";
    if (f.segments > 1) message << " and " << f.segments - 1 << " more segment(s)";
  }
  if (found.size() > kNamed) message << "; and " << found.size() - kNamed << " more tensors";
  return Status::Corruption(message.str());
}

}  // namespace weightsync::core
