#include "transport/path/tcp_step_reader.h"

#include "util/fail_point.h"

namespace weightsync::transport::path {

void TcpStepReader::Prepare(const PathContext& ctx, HostLanding* landing, bool deltas_fit) {
  link_ = ctx.link;
  plan_ = ctx.plan;
  landing_ = landing;
  // Where a whole step lands is fixed once the landing is prepared: built once, read every step.
  parts_.clear();
  landing_parts_.clear();
  for (const plan::PlannedTensor& t : plan_->tensors) {
    parts_.push_back({landing_->ReceivedTensor(t), t.nbytes});
    landing_parts_.push_back(
        {t.publisher_index, t.src_offset, landing_->ReceivedTensor(t), t.nbytes});
  }
  deltas_fit_ = deltas_fit;
  if (deltas_fit_) deltas_.Prepare(plan_, ctx.welcome, landing_);
}

Status TcpStepReader::Read(const wire::StepBegin& begin, LandingObserver* observer,
                           const util::Deadline& deadline) {
  WS_FAIL_POINT_RETURN("tcp.before_data");
  if (deltas_.expected()) {
    WS_RETURN_IF_ERROR(
        deltas_.Receive(link_->channel(), link_->peer(), begin.step, deadline, observer));
  } else {
    const bool observed = observer != nullptr && observer->Begin(begin.step, landing_parts_);
    Status s = link_->channel().ReadAll(parts_, deadline, observed ? observer : nullptr);
    if (!s.ok()) return s.WithContext("step " + std::to_string(begin.step) + " data");
  }
  landing_->MaybeInjectBitFlip();
  return Status::Ok();
}

}  // namespace weightsync::transport::path
