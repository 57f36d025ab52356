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
#include "transport/link/publisher_session.h"
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

// Both ends of a data path, as NCCL's ncclTransport holds send and recv: the subscriber's receive
// (`make`) and, where the publisher sends the bytes itself (tcp), its delivery (`deliver`); the
// rows whose subscriber reads the publisher's memory (a Unix socket) need none from it but the
// copy_done handshake of every session.
struct PathEntry {
  std::string_view name;   // the handle's transport_name(): "shm", "cuda-ipc", ...
  std::string_view moves;  // what it does, for `weightsync info`
  bool (*can_serve)(link::LinkKind link, wire::ArenaKind store, DestinationKind destinations);
  std::unique_ptr<path::DataPath> (*make)();
  link::DeliveryFactory deliver = nullptr;  // the publisher's end over tcp
};

// In order of preference.
std::span<const PathEntry> PathTable();

// The entry serving this combination, or NotSupported: "<peer> keeps its arena in GPU memory
// (cuda:0); no data path moves it over tcp into host memory: destination 'w' is on cpu".
Result<const PathEntry*> ChoosePath(const link::Link& link, const wire::Welcome& welcome,
                                    const std::vector<plan::Destination>& destinations);

// The publisher's end over tcp for a store of `store`'s kind: the delivery of the first row that
// serves it over tcp into any destinations. A tcp session makes it once the subscriber's Select
// arrived (link::DeliveryFactory); FailedPrecondition when no row sends from such a store.
Result<std::unique_ptr<link::StepDelivery>> DeliverOverTcp(link::Channel& ch,
                                                           const link::SessionConfig& config,
                                                           const wire::Welcome& welcome,
                                                           int store_fd,
                                                           const wire::Select& select);

}  // namespace weightsync::transport
