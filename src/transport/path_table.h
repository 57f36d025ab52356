// The path table: which data path moves the bytes of a handle, chosen from what the handle knows
// once it is connected — the link (Unix socket or tcp), the publisher's store (host memory or a
// GPU) and where the destinations are (host memory or one CUDA device). One ordered table of
// {name, can_serve, factory}, as NCCL's transports answer canConnect: the first entry that can
// serve the combination is used, and its name is the handle's transport_name(). A combination no
// entry serves is a table fact with one error text naming a destination and its device.
// `weightsync info` prints the table. Adding a data path is one file under path/ and one row here.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "plan/plan.h"
#include "transport/link/link.h"
#include "transport/path/data_path.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport {

// Where a handle's destinations are.
enum class DestinationKind : uint8_t {
  kHost,   // every destination in host memory
  kCuda,   // every destination on one CUDA device
  kMixed,  // host and CUDA memory, or several CUDA devices
};
DestinationKind KindOf(const std::vector<plan::Destination>& destinations);

struct PathEntry {
  std::string_view name;   // the handle's transport_name(): "shm", "cuda-ipc", ...
  std::string_view moves;  // what it does, for `weightsync info`
  bool (*can_serve)(link::LinkKind link, wire::ArenaKind store, DestinationKind destinations);
  std::unique_ptr<path::DataPath> (*make)();
};

// In order of preference.
std::span<const PathEntry> PathTable();

// The entry serving this combination, or NotSupported: "<peer> keeps its arena in GPU memory
// (cuda:0); no data path moves it over tcp into host memory: destination 'w' is on cpu".
Result<const PathEntry*> ChoosePath(const link::Link& link, const wire::Welcome& welcome,
                                    const std::vector<plan::Destination>& destinations);

}  // namespace weightsync::transport
