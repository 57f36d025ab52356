// The store table: where a publisher keeps its versions, chosen once (at its first Publish) from
// where its tensors are and what it was asked for — one ordered table of {name, holds, can_hold,
// make}, as the path table is for subscribers: the first row that can hold the publisher's
// tensors is used. `weightsync info` prints it. Adding a store shape is one store file and one
// row here (plus, for subscribers, its view).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "transport/store/version_store.h"
#include "weightsync/options.h"
#include "weightsync/status.h"

namespace weightsync::transport::store {

// What the table chooses by.
struct StoreRequest {
  const PublisherOptions* options = nullptr;
  int cuda_device = -1;  // ≥ 0: the registered tensors are on this CUDA device
  std::string name;      // names the store's host memory (the endpoint's name)
  // The host store made when the publisher was created (Allocate()d tensors live in it): the host
  // arena row takes it.
  std::unique_ptr<VersionStore>* host_store = nullptr;
};

struct StoreEntry {
  std::string_view name;   // "host-arena", "gpu-arena", "zero-copy", "host-ring", "gpu-ring"
  std::string_view holds;  // what it keeps, for `weightsync info`
  // The version is the registered tensors themselves (read where they are): Publish only hashes,
  // and the trainer fences its writes with BeginWrite (VersionSlots `shared`).
  bool versions_are_the_tensors = false;
  bool (*can_hold)(const StoreRequest& request);
  Result<std::unique_ptr<VersionStore>> (*make)(const StoreRequest& request);
};

// In order of preference.
std::span<const StoreEntry> StoreTable();

// The first row that can hold `request`'s tensors; NotSupported naming the combination when none
// can (a table fact, one text).
Result<const StoreEntry*> ChooseStore(const StoreRequest& request);

}  // namespace weightsync::transport::store
