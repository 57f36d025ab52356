#include "transport/path/tcp_read_path.h"

#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync::transport::path {

TcpReadPath::~TcpReadPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "tcp") << "path cleanup: " << s;
}

Status TcpReadPath::Prepare(const PathContext& ctx) {
  link_ = ctx.link;
  plan_ = ctx.plan;
  digest_kind_ = ctx.welcome->digest_kind;
  parts_.assign(plan_->tensors.size(), iovec{});
  landing_parts_.assign(plan_->tensors.size(), LandingPart{});
  staged_ = ctx.mode == UpdateMode::kStaged;
  committed_here_ = false;
  fits_deltas_ = DeltaReceiver::Fits(*plan_, *ctx.welcome);
  WS_RETURN_IF_ERROR(landing_.Prepare(plan_, *ctx.destinations, ctx.mode, ctx.CopyThreads()));
  if (fits_deltas_) deltas_.Prepare(plan_, ctx.welcome, &landing_);
  return Status::Ok();
}

Status TcpReadPath::Copy(const wire::StepBegin& begin, bool /*verify*/,
                         const util::Deadline& deadline) {
  committed_here_ = false;  // from the first byte read, the shadow holds neither version
  if (deltas_.expected()) {
    WS_FAIL_POINT_RETURN("tcp.before_data");
    WS_RETURN_IF_ERROR(
        deltas_.Receive(link_->channel(), link_->peer(), begin.step, deadline, observer_));
    landing_.MaybeInjectBitFlip();
    return Status::Ok();
  }
  for (size_t i = 0; i < plan_->tensors.size(); ++i) {
    const plan::PlannedTensor& t = plan_->tensors[i];
    parts_[i] = {landing_.ReceivedTensor(t), t.nbytes};
    landing_parts_[i] = {t.publisher_index, t.src_offset, landing_.ReceivedTensor(t), t.nbytes};
  }
  WS_FAIL_POINT_RETURN("tcp.before_data");
  const bool observed = observer_ != nullptr && observer_->Begin(begin.step, landing_parts_);
  Status s = link_->channel().ReadAll(parts_, deadline, observed ? observer_ : nullptr);
  if (!s.ok()) return s.WithContext("step " + std::to_string(begin.step) + " data");
  landing_.MaybeInjectBitFlip();
  return Status::Ok();
}

Status TcpReadPath::Verify(std::span<const uint64_t> digests, int64_t step,
                           const util::Deadline& /*deadline*/) {
  return landing_.Verify(digests, digest_kind_, step);
}

Status TcpReadPath::Commit(const util::Deadline& /*deadline*/) {
  // Staged, a step that came as deltas writes only what changed into the destinations.
  bool sparse = false;
  if (staged_ && deltas_.expected()) sparse = deltas_.CommitSparse();
  if (!sparse) WS_RETURN_IF_ERROR(landing_.Commit());
  committed_here_ = true;
  return Status::Ok();
}

Status TcpReadPath::Release() {
  Status s = deltas_.Release();
  s.Update(landing_.Release());
  if (!s.ok()) WS_LOG(WARN, "tcp") << "release: " << s;
  return s;
}

}  // namespace weightsync::transport::path
