#include "transport/link/version_source.h"

#include "util/fail_point.h"

namespace weightsync::transport::link {

wire::StepBegin AsOffered(const wire::StepBegin& pinned, const wire::UpdateRequest& request,
                          uint32_t slot_count) {
  wire::StepBegin offered = pinned;
  if (pinned.step == request.after_step) return offered;  // up to date: nothing pinned
  if (util::FailPoints::Check("publisher.offer_older_step").action == util::FailAction::kFlip) {
    offered.step = request.after_step - 1;
  }
  if (util::FailPoints::Check("publisher.offer_bad_slot").action == util::FailAction::kFlip) {
    offered.slot = slot_count;
  }
  return offered;
}

}  // namespace weightsync::transport::link
