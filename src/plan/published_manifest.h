// What the publishers publish, as one manifest (Subscriber::PublishedManifest): the union of their
// layouts, each name once, a publisher's shard of a global tensor standing for that global tensor
// (its name and global shape), and tied weights named as aliases of their original
// (TensorSpec::alias_of). Built from the Welcomes alone, without preparing anything.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "weightsync/manifest.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::plan {

class PublishedManifest {
 public:
  // Adds the tensors of `welcome` (ValidateLayout passed), from the publisher named `source`.
  // InvalidArgument when a name it publishes has another dtype or shape at an earlier publisher;
  // ProtocolError when a shard's global shape has no byte size. Nothing is added then.
  Status Add(const wire::Welcome& welcome, std::string_view source);
  // The manifest, in first-seen order.
  Result<Manifest> Finish() &&;

 private:
  std::vector<TensorSpec> specs_;
  std::vector<std::string> from_;                  // which publisher each spec came from
  std::unordered_map<std::string, size_t> index_;  // name → position in specs_
};

}  // namespace weightsync::plan
