#include "transport/path/host_copy_path.h"

#include <algorithm>

#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync::transport::path {

HostCopyPath::~HostCopyPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "shm") << "path cleanup: " << s;
}

Status HostCopyPath::Prepare(const PathContext& ctx) {
  welcome_ = ctx.welcome;
  peer_ = ctx.link->peer();
  WS_ASSIGN_OR_RETURN(view_, view::MapHostStore(*welcome_, std::move(*ctx.store_fd), ctx.link));
  const int threads =
      std::min<int>(ctx.CopyThreads(), std::max<size_t>(ctx.plan->segments.size(), 1));
  WS_RETURN_IF_ERROR(landing_.Prepare(ctx.plan, *ctx.destinations, ctx.mode, threads));
  landing_.PrepareCopies(*view_);
  return Status::Ok();
}

Status HostCopyPath::Copy(const wire::StepBegin& begin, bool /*verify*/,
                          const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(view_->Step(begin, deadline,
                                 [&](uint32_t unit) { return landing_.CopyUnit(unit, deadline); }));
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
  // Reverse order of creation: landing (staging, workers), then the store's mapping.
  if (Status s = landing_.Release(); !s.ok()) {
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  if (view_) {
    if (Status s = view_->Release(); !s.ok()) {
      WS_LOG(WARN, "shm") << "release: " << s;
      result.Update(s);
    }
    view_.reset();
  }
  return result;
}

}  // namespace weightsync::transport::path
