// A Subscriber applies published weight versions into tensors the caller owns.
//
// Ownership: never owns caller memory; it writes it. Call Sleep() (or Close()) before freeing it.
// Lifecycle: the first Update() prepares a transfer handle (connection, mapping, plan, staging);
// later updates reuse it. A failed update destroys it; the next update prepares a new one.
// Thread safety: one Update() at a time; a concurrent call returns Busy. Close() may be called
// from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightsync/manifest.h"
#include "weightsync/options.h"
#include "weightsync/publisher.h"
#include "weightsync/status.h"
#include "weightsync/tensor_view.h"
#include "weightsync/update_stats.h"

namespace weightsync {

struct UpdateOptions {
  std::optional<int64_t> step;  // nullopt: the latest published step
  std::optional<bool> verify;   // nullopt: SubscriberOptions::verify
  // LineagePolicy::kStrict: this update follows the publisher into a new lineage (or a restart
  // whose steps are not newer) instead of refusing it. No effect under kFollow.
  bool accept_new_lineage = false;
  // After the commit (or for an up-to-date step), digest the destinations' own memory and compare
  // it with the committed version's digests: CheckWeights() as part of the update. A difference
  // fails the update with Corruption naming every tensor that differs, and the weights are marked
  // invalid until an update rewrites them.
  bool check_weights = false;
};

class Subscriber {
 public:
  // Cheap: validates options; connects lazily at the first Update().
  static Result<std::unique_ptr<Subscriber>> Create(const SubscriberOptions& options);
  ~Subscriber();

  // Registers destination tensors (before the first update, or after Sleep() or a failed
  // update). A name registered before takes the new memory (an engine that freed and re-allocated
  // its weights); the next update then writes every destination, even if the step is the one
  // committed. Destinations must not share memory, except exact aliases — the same address,
  // dtype and shape under two names (tied weights) — which are written once per step.
  // InvalidArgument names the problem; nothing is registered then.
  Status Register(const std::vector<NamedTensor>& tensors);
  // Forgets the named destinations (same conditions as Register). NotFound lists unknown names;
  // nothing is removed then.
  Status Unregister(const std::vector<std::string>& names);
  // What the publishers publish (name, dtype, shape), read over a short-lived connection to each
  // without preparing anything, so an engine that allocates its own buffers can mirror them
  // before registering. A publisher's shard of a global tensor (regions) counts as that global
  // tensor (its name and global shape): sharded trainers look like the model they hold together.
  // With several publishers: the union, each name once; InvalidArgument when two publishers
  // disagree on a name's dtype or shape. Busy during an update. A publisher
  // answers once its layout is fixed (its first Publish); until then this waits, within
  // SubscriberOptions.timeout.
  Result<Manifest> PublishedManifest();
  Result<UpdateStats> Update(const UpdateOptions& options = {});
  Result<UpdateStats> Update(int64_t step) { return Update(UpdateOptions{.step = step}); }
  // Digests the destination memory itself — the engine's weights as they are now, not the bytes
  // received — on the GPU with the digest kernels for CUDA destinations, on the CPU for host ones,
  // and compares it with the digests the publisher sent for the committed version. Corruption
  // names every tensor that differs (and the byte ranges); the weights are then marked invalid
  // (weights_valid() false) and the next Update() rewrites every destination, even at the
  // committed step ("corrupt, then restore"). Destinations holding bytes no digest describes
  // (converted in flight, or filled from parts of digest segments) are counted as unchecked.
  // Needs a committed version and the prepared handle (FailedPrecondition before the first
  // update, after Sleep() or a failed update); Busy during an update. An engine whose own loader
  // post-processes the received tensors (load_weights) checks the received copy, not its weights.
  Result<WeightsCheck> CheckWeights();
  // Releases the transfer handle (mapping, connection, staging). The next Update re-prepares. A
  // relay of CUDA destinations also gives back its GPU store (its children find no publisher at
  // its serve_endpoint until its next update serves there again); a host relay keeps serving.
  Status Sleep();
  Status Close();
  // Makes the update in flight (if any) stop at its next wait and return Cancelled, within about
  // 20 ms, as a failed update (staged: old weights intact; in place: marked invalid if bytes had
  // moved). Thread-safe; an update that starts later is not affected.
  Status Cancel();

  int64_t committed_step() const;  // -1 before the first successful update
  // A relay's endpoint as bound (SubscriberOptions::serve_endpoint; for tcp://HOST:0 with its
  // port); empty when this subscriber serves nothing.
  std::string serve_endpoint() const;
  // A relay's children connected now (Publisher::Members of what it serves); empty otherwise.
  std::vector<MemberInfo> ServedMembers() const;
  // A relay's whole subtree (Publisher::Tree of what it serves); empty otherwise.
  std::vector<MemberInfo> ServedTree() const;
  // The lineage of the committed version (of the first publisher, with several); empty before
  // the first successful update.
  std::string committed_lineage() const;
  // False after a failed in_place update, until the next successful one.
  bool weights_valid() const;

  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;
  struct Impl;

 private:
  explicit Subscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightsync
