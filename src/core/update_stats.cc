#include "weightsync/update_stats.h"

namespace weightsync {

std::string_view ConvertedOnName(ConvertedOn where) {
  switch (where) {
    case ConvertedOn::kNone:
      return "none";
    case ConvertedOn::kHost:
      return "host";
    case ConvertedOn::kDestinationGpu:
      return "destination-gpu";
    case ConvertedOn::kPublisherGpu:
      return "publisher-gpu";
  }
  return "unknown";
}

}  // namespace weightsync
