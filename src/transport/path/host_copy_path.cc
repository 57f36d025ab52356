#include "transport/path/host_copy_path.h"

#include <algorithm>

#include "transport/link/step_exchange.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "util/worker_pool.h"

namespace weightsync::transport::path {

HostCopyPath::~HostCopyPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "shm") << "path cleanup: " << s;
}

Status HostCopyPath::Prepare(const PathContext& ctx) {
  welcome_ = ctx.welcome;
  peer_ = ctx.link->peer();
  util::UniqueFd fd = std::move(*ctx.store_fd);
  WS_RETURN_IF_ERROR(
      store::CheckImportedSegment(fd.get(), welcome_->arena_bytes).WithContext(peer_));
  WS_ASSIGN_OR_RETURN(mapping_, store::Mapping::Map(fd.get(), welcome_->arena_bytes,
                                                    /*writable=*/false, "arena of " + peer_));
  // The mapping keeps the memory alive; the fd is no longer needed.
  WS_RETURN_IF_ERROR(fd.Close());
  link_ = ctx.link;
  // From a ring, every bucket's pieces are shared among the workers.
  const size_t work =
      welcome_->version_buckets > 0 ? ctx.plan->segments.size() : ctx.plan->buckets.size();
  const int threads = std::min<int>(ctx.CopyThreads(), std::max<size_t>(work, 1));
  WS_RETURN_IF_ERROR(landing_.Prepare(ctx.plan, *ctx.destinations, ctx.mode, threads));
  if (welcome_->version_buckets > 0) {
    landing_.PrepareRing(welcome_->slot_bytes, welcome_->version_buckets);
  }
  return Status::Ok();
}

Status HostCopyPath::CopyFromRing(const wire::StepBegin& begin, const util::Deadline& deadline) {
  const uint8_t* slots = mapping_.data() + welcome_->slots_offset;
  return link::ReadRingBuckets(link_->channel(), peer_, begin.step, welcome_->version_buckets,
                               welcome_->slot_count, deadline, [&](uint32_t b, uint32_t slot) {
                                 landing_.CopyRingBucket(
                                     b, slots + uint64_t{slot} * welcome_->slot_bytes);
                                 return Status::Ok();
                               });
}

Status HostCopyPath::Copy(const wire::StepBegin& begin, bool /*verify*/,
                          const util::Deadline& deadline) {
  const uint8_t* arena = mapping_.data();
  if (welcome_->version_buckets > 0) {
    WS_RETURN_IF_ERROR(CopyFromRing(begin, deadline));
  } else {
    WS_RETURN_IF_ERROR(landing_.CopyFromArena(
        arena + welcome_->slots_offset + uint64_t{begin.slot} * welcome_->slot_bytes,
        arena + welcome_->direct_offset, deadline));
  }
  landing_.MaybeInjectBitFlip();
  // Bytes in shared memory cannot be "lost"; a publisher that died or was stopped meanwhile is
  // caught by the step's end, which needs its confirmation before anything is committed.
  if (util::FailPoints::Check("shm.after_copy").action == util::FailAction::kError) {
    return Status::Internal("injected failure at fail point 'shm.after_copy'");
  }
  if (deadline.expired()) {
    return Status::Timeout(peer_, ": copy of step ", begin.step, " did not finish in time");
  }
  return Status::Ok();
}

Status HostCopyPath::Verify(std::span<const uint64_t> digests, int64_t step,
                            const util::Deadline& /*deadline*/) {
  return landing_.Verify(digests, welcome_->digest_kind, step);
}

Status HostCopyPath::Commit(const util::Deadline& /*deadline*/) { return landing_.Commit(); }

Status HostCopyPath::Release() {
  Status result;
  // Reverse order of creation: landing (staging, workers), then the mapping.
  if (Status s = landing_.Release(); !s.ok()) {
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  if (Status s = mapping_.Close(); !s.ok()) {
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  return result;
}

}  // namespace weightsync::transport::path
