#!/usr/bin/env python3
"""Planted bugs the test suite must catch: for each mutant, replace exact pieces of one source
file, rebuild the one test binary that should notice, run the named tests, and expect them to FAIL;
the source is restored after each, whatever happens. A mutant that survives (its tests pass) is a
guard without a test.

    python3 scripts/mutants.py                 # every mutant (a few minutes each on 2 cores)
    python3 scripts/mutants.py close-order     # some of them, by name
    python3 scripts/mutants.py --list

The pieces are matched exactly (each must occur once): when the code they name changes, the
script says which mutant no longer applies instead of testing nothing. Uses the `build/` tree of
`make test` (BUILD=... for another). Not part of CI: it rebuilds per mutant (docs/ci.md).
"""

import argparse
import dataclasses
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Mutant:
    name: str
    why: str  # the guard it deletes
    path: str
    edits: list  # (old, new) pairs, each old occurring exactly once
    target: str  # the test binary (CMake target) that must fail
    tests: str  # its --gtest_filter
    # Seconds its tests may run: a mutant that makes them hang (a deadlock) is killed by that.
    timeout: int = 900


MUTANTS = [
    Mutant("placement-room", "a newcomer is sent to a relay that reported no room for it",
           "src/core/publisher.cc",
           [("      if (room > 0 && (best.member == nullptr || key < best_key)) {",
             "      if ((best.member == nullptr || key < best_key)) {")],
           "core_relay_topology_test", "*ANewcomerGoesToTheShallowestRelayWithRoom*"),
    Mutant("placement-tree", "only the trainer's direct relays are candidates, not the tree below",
           "src/core/publisher.cc",
           [("      for (const wire::ReportedMember& e : m.subtree) {",
             "      for (const wire::ReportedMember& e : std::vector<wire::ReportedMember>()) {")],
           "core_relay_topology_test", "*ANewcomerGoesToTheShallowestRoomNotDownTheLightest*"),
    Mutant("placement-depth", "a newcomer goes to the least loaded relay with room, however deep",
           "src/core/publisher.cc",
           [("      const std::tuple<bool, uint32_t, int64_t> key{!is_near, depth, load};",
             "      const std::tuple<bool, uint32_t, int64_t> key{!is_near, 0, load};")],
           "core_relay_topology_test", "*ANewcomerGoesToTheShallowestRoomNotDownTheLightest*"),
    Mutant("placement-pending", "newcomers sent to a deep relay before it reports are not counted",
           "src/core/publisher.cc",
           [("        sent.count = SentTo(relay.endpoint()) + 1;", "        sent.count = 0;")],
           "core_relay_topology_test", "*ANewcomerGoesToTheShallowestRoomNotDownTheLightest*"),
    Mutant("placement-avoid-below", "a replica may be sent below the relay it lost a step through",
           "src/core/publisher.cc",
           [("          skip_below = e.depth;\n", "")],
           "core_relay_topology_test", "*AReplicaIsNotSentBelowTheRelayItLost*"),
    Mutant("report-depth-first", "a members report's list need not be a depth-first tree",
           "src/wire/members_report.cc",
           [("    if (e.depth < 1 || e.depth > previous_depth + 1 || e.depth > kMaxTreeDepth) {",
             "    if (e.depth < 1 || e.depth > kMaxTreeDepth) {")],
           "wire_members_report_test", "WireMembersReport.RefusesWhatIsNotADepthFirstTree"),
    Mutant("report-via", "a reported member below depth 1 need not name the relay serving it",
           "src/wire/members_report.cc",
           [("    if ((e.depth == 1) != e.via.empty()) {", "    if (false) {")],
           "wire_members_report_test", "WireMembersReport.RefusesWhatIsNotADepthFirstTree"),
    Mutant("report-latest", "a member may report holding a step the publisher never published",
           "src/core/publisher.cc",
           [("    if (step <= latest) return Status::Ok();", "    return Status::Ok();")],
           "transport_link_hostile_client_test", "*AReportOfAStepNeverPublished*"),
    Mutant("report-leaf", "a member that serves nothing may report a subtree",
           "src/core/publisher.cc",
           [("    if (m != nullptr && m->info.serves.empty() && !report.members.empty()) {",
             "    if (false) {")],
           "transport_link_hostile_client_test", "*AReportOfAStepNeverPublished*"),
    Mutant("report-after-commit", "a subscriber does not say what it committed",
           "src/core/subscriber.cc",
           [("  ReportMembers(/*between_updates=*/false);\n", "")],
           "core_relay_test", "*MembershipSaysWhoHoldsWhichStepAtEachLevel*"),
    Mutant("report-push", "a relay says what changed below it only when it updates",
           "src/core/subscriber.cc",
           [("      impl->relay->OnMembersChanged([r = impl->reporter.get()] { r->Changed(); });\n",
             "")],
           "core_relay_test", "*TheTrainersTreeListsEveryReplica*"),
    Mutant("report-busy", "a call that meets a report between updates answers Busy",
           "src/core/subscriber.cc",
           [("      if (!reporting) return false;", "      return false;")],
           "core_relay_test", "*ACallDuringAReportBetweenUpdates*"),
    Mutant("report-failed", "an update after a failed report asks on a connection it may have broken",
           "src/core/subscriber.cc",
           [("  if (report_failed) {\n    report_failed = false;", "  if (false) {\n    report_failed = false;")],
           "core_relay_test", "*AFailedReportMakesTheNextUpdatePrepareAnew*"),
    Mutant("report-tree-via", "the trainer's tree does not say through which relay a replica is served",
           "src/core/publisher.cc",
           [("      if (e.via.empty()) below.via = m.info.serves;\n", "")],
           "core_relay_test", "*TheTrainersTreeListsEveryReplica*"),
    Mutant("close-order", "Close() gives up the endpoint lock before removing its socket file",
           "src/transport/link/unix_server.cc",
           [("  util::FailPoints::Check(\"shm.server.before_unlink\");",
             "  if (lock_) result.Update(lock_->Release());\n"
             "  util::FailPoints::Check(\"shm.server.before_unlink\");"),
            ("  // Last: once the lock is gone, a successor may bind the path.\n"
             "  if (lock_) result.Update(lock_->Release());  // logs each failure itself\n", "")],
           "transport_link_endpoint_ownership_test",
           "EndpointOwnership.ASuccessorTakingTheEndpointDuringACloseStaysReachable"),
    Mutant("ring-revoke", "BeginWrite past the timeout does not revoke the ring's members",
           "src/transport/store/version_slots.cc", [("  if (ring_) ring_->RevokeAll();\n", "")],
           "core_ring_test", "*BeginWritePastTheTimeoutRevokesAReaderInTheRing*"),
    Mutant("retry-appends", "a retried first Publish appends its copy+hash tasks",
           "src/transport/store/host_store.cc",
           [("  tasks_ = std::move(tasks);",
             "  tasks_.insert(tasks_.end(), tasks.begin(), tasks.end());")],
           "core_publisher_test", "PublisherRetry.*"),
    Mutant("ring-tied-twice", "the host ring fills a tied tensor once per name",
           "src/transport/store/host_ring_store.cc",
           [("    if (t.alias_of >= 0) continue;  // a tied tensor's bytes are its original's\n",
             "")],
           "transport_store_host_ring_store_test", "*Tied*"),
    Mutant("region-hole", "a destination its pieces leave a hole in is scheduled",
           "src/plan/regions.cc",
           [("    if (!overlap && destinations[d].written && covered[d] != elements) {",
             "    if (false) {")],
           "plan_regions_test", "*Hole*"),
    Mutant("region-overlap", "two pieces writing the same destination bytes are scheduled",
           "src/plan/regions.cc",
           [("        if (auto both = Intersect(a, b)) {",
             "        if (auto both = Intersect(a, b); false && both) {")],
           "plan_regions_test", "*SameBytes*:*DoublyClaimed*"),
    Mutant("partial-verify", "segments received whole for a part (region pieces) go unverified",
           "src/transport/path/host_landing.cc",
           [("  const plan::Segment& s = self->plan_->segments[index];\n"
             "  if (self->Digest(s) != self->digests_[s.digest_index]) {",
             "  const plan::Segment& s = self->plan_->segments[index];\n"
             "  if (s.converted) return;\n"
             "  if (self->Digest(s) != self->digests_[s.digest_index]) {")],
           "core_regions_test", "*ASegmentReadInPartIsVerifiedWhole*"),
    Mutant("frame-bound", "a header is bound by the channel's cap only, not by its frame type",
           "src/wire/frame.cc",
           [("MaxPayloadOf(static_cast<FrameType>(type))});", "kMaxPayloadBytes});")],
           "transport_link_tcp_auth_test", "TcpNoToken.*"),
    Mutant("close-cancels", "Close() waits for an update in flight instead of cancelling it",
           "src/core/subscriber.cc",
           [("  d.closing.store(true);\n  d.cancel.store(true);\n",
             "  d.closing.store(true);\n")],
           "core_subscriber_test", "*CloseCancelsAnUpdate*"),
    Mutant("closing-refused", "an update starting while Close() runs clears its cancel",
           "src/core/subscriber.cc",
           [("    if (closing.load()) return Status::FailedPrecondition(\"subscriber is closed\");\n",
             "")],
           "core_subscriber_test", "*AnUpdateStartingWhileCloseIsUnderWay*"),
    Mutant("sleep-after-close", "Sleep() after Close() succeeds silently",
           "src/core/subscriber.cc",
           [("  if (d.closed) return Status::FailedPrecondition(\"subscriber is closed\");\n"
             "  CallerDevice caller_device(d.registered.any_cuda());\n"
             "  Status s = d.ReleaseHandles(\"sleep\");",
             "  CallerDevice caller_device(d.registered.any_cuda());\n"
             "  Status s = d.ReleaseHandles(\"sleep\");")],
           "core_subscriber_test", "*EveryCallAfterCloseIsRefused*"),
    Mutant("copy-cancel", "a host copy runs to its end after a cancel",
           "src/transport/path/host_landing.cc",
           [("  if (self->copy_deadline_->cancelled()) {", "  if (false) {")],
           "core_subscriber_test", "*CloseStopsAnInPlaceCopy*"),
    Mutant("check-compare", "the weights check compares nothing",
           "src/transport/path/destination_check.cc",
           [("    if (actual_[p] == digests[piece.digest]) continue;", "    continue;")],
           "core_weights_check_test", "*"),
    Mutant("check-restores", "a failed weights check leaves the next update 'up to date'",
           "src/core/subscriber.cc",
           [("registration_changed || weights_differ) {", "registration_changed) {")],
           "core_weights_check_test", "*AChangedByteIsNamedAndTheNextUpdateRestoresIt*"),
    Mutant("alias-rules", "Manifest accepts an alias of anything", "src/base/manifest.cc",
           [("    if (!s.alias_of.empty()) {\n      const TensorSpec* original = nullptr;",
             "    if (false) {\n      const TensorSpec* original = nullptr;")],
           "plan_published_manifest_test", "ManifestAliases.*"),
    Mutant("alias-unnamed", "the published manifest does not say which names are one tensor",
           "src/plan/plan.cc", [("      alias[i] = static_cast<int64_t>(it->second);\n", "")],
           "core_registration_test", "*ThePublishedManifestNamesTiedWeights*"),
    Mutant("delta-code", "a delta chunk with an unknown directory code is read as a list",
           "src/delta/segment_delta.cc",
           [("    if (code > kMaxListed && code != kBitmap && code != kWhole) {",
             "    if (false) {")],
           "delta_segment_delta_test", "CheckDelta.UnknownCodes*"),
    Mutant("delta-list-length", "a delta lists more elements than its last chunk has",
           "src/delta/segment_delta.cc",
           [("    if (code <= kMaxListed && code > ChunkLength(elements, chunk)) {",
             "    if (false) {")],
           "delta_segment_delta_test", "CheckDelta.UnknownCodes*"),
    Mutant("delta-offsets", "a delta's offsets may repeat or point past their chunk",
           "src/delta/segment_delta.cc",
           [("        if (index[k] >= length || (k > 0 && index[k] <= index[k - 1])) {",
             "        if (false) {")],
           "delta_segment_delta_test", "CheckDelta.OffsetsMustIncrease*"),
    Mutant("delta-bitmap-end", "a delta's bitmap may mark elements past its chunk",
           "src/delta/segment_delta.cc",
           [("      if (set == 0 || in_chunk != set) {", "      if (set == 0) {")],
           "delta_segment_delta_test", "CheckDelta.Bitmaps*"),
    Mutant("delta-value-room", "a delta whose values do not fill the rest exactly is applied",
           "src/delta/segment_delta.cc",
           [("  if (value_room != shape.value_bytes) {", "  if (value_room < shape.value_bytes) {")],
           "delta_segment_delta_test", "CheckDelta.ShortAndLong*"),
    Mutant("delta-index-room", "a delta too short for its index is read past its end",
           "src/delta/segment_delta.cc",
           [("  if (delta.size() - chunks < shape.index_bytes) {", "  if (false) {")],
           "delta_segment_delta_test", "CheckDelta.ShortAndLong*"),
    Mutant("delta-whole-limit", "a delta larger than the segment is sent instead of the segment",
           "src/delta/segment_delta.cc",
           [("    if (values + cost + index_.size() > out.size()) return std::nullopt;",
             "    if (false) return std::nullopt;")],
           "delta_segment_delta_test", "SegmentDelta.*"),
    Mutant("delta-bitmap-empty", "a delta chunk's bitmap may mark nothing",
           "src/delta/segment_delta.cc",
           [("      if (set == 0 || in_chunk != set) {", "      if (in_chunk != set) {")],
           "delta_segment_delta_test", "CheckDelta.Bitmaps*"),
    Mutant("delta-lane-fold", "the word kernel does not fold a lane onto its lowest bit",
           "src/delta/change_mask.cc",
           [("    for (uint32_t shift = kBits / 2; shift >= 1; shift /= 2) x |= x >> shift;\n", "")],
           "delta_change_mask_test", "ChangeMask.*"),
    Mutant("delta-model-cost", "the size model forgets the directory byte of every chunk",
           "src/delta/segment_delta.cc",
           [("  double chunk = 1;  // the directory byte", "  double chunk = 0;")],
           "delta_segment_delta_test", "SegmentDelta.TheSizeModel*"),
    Mutant("plan-sim-room", "plan-sim prices deltas larger than the publisher's kAuto room",
           "src/delta/segment_delta.cc",
           [("  return model * kAutoRoomDivisor > element_bytes ? element_bytes : model;",
             "  return model;")],
           "tools_plan_sim_test", "PlanSimModel.Deltas*"),
    Mutant("fanout-min", "fanout-sim takes a tree of fan-out 1 for a tree",
           "tools/fanout_model.cc", [("    if (f < 2) return", "    if (f < 1) return")],
           "tools_plan_sim_test", "FanoutModel.BadOptions*"),
    Mutant("fanout-egress", "a tree's trainer feeds every replica when there are fewer than f",
           "tools/fanout_model.cc",
           [("  const uint64_t first = std::min(f, n);  // the trainer's own children",
             "  const uint64_t first = f;")],
           "tools_plan_sim_test", "FanoutModel.DirectTreeAndChainByHand"),
    Mutant("delta-wrong-base", "deltas encoded against another base are applied",
           "src/transport/path/delta_receiver.cc",
           [("    if (begin_.base_digest != ours) {", "    if (false) {")],
           "core_delta_update_test", "*AWrongBaseIsRefused*"),
    Mutant("delta-begin-step", "a delta_begin of another step is read as this one's",
           "src/transport/path/delta_receiver.cc", [("  if (begin_.step != step) {", "  if (false) {")],
           "transport_path_delta_receiver_test", "*ADeltaBeginOfAnotherStepIsRefused*"),
    Mutant("delta-base-step", "deltas against another step than the committed one are read",
           "src/transport/path/delta_receiver.cc",
           [("  if (begin_.base_step != base_step_) {", "  if (false) {")],
           "transport_path_delta_receiver_test", "*AnotherStepThanTheCommittedOne*"),
    Mutant("delta-segment-count", "delta sizes for another number of segments are read",
           "src/transport/path/delta_receiver.cc",
           [("  if (begin_.bytes.size() != plan_->segments.size()) {", "  if (false) {")],
           "transport_path_delta_receiver_test", "*SizesForAnotherNumberOfSegments*"),
    Mutant("delta-size-bound", "a delta larger than its segment could need is read",
           "src/transport/path/delta_receiver.cc",
           [("    if (begin_.bytes[i] > most) {", "    if (false) {")],
           "transport_path_delta_receiver_test", "*ADeltaLargerThanItsSegment*"),
    Mutant("delta-check-first", "deltas are applied before every one of the step's is checked",
           "src/transport/path/delta_receiver.cc",
           [("  landing_->workers()->Run(count, &DeltaReceiver::CheckSegment, this);\n", "")],
           "transport_path_delta_receiver_test", "*AMalformedDelta*"),
    Mutant("encode-await", "a session sends a step's deltas before their encode finished",
           "src/transport/store/host_store.cc",
           [("  while (pending_slot_ == static_cast<int64_t>(slot)) {\n    if (deadline.cancelled()",
             "  while (false) {\n    if (deadline.cancelled()")],
           "core_delta_update_test", "*PublishReturnsBeforeItsDeltasAreEncoded*"),
    Mutant("encode-before-write", "a version is written into a slot the running encode reads",
           "src/transport/store/host_store.cc",
           [("  // uses the workers.\n  WaitEncoded();\n", "  // uses the workers.\n")],
           "core_delta_update_test", "*APublishDuringAnEncodeWaits*", timeout=120),
    Mutant("encode-off-path", "Publish encodes its deltas before it returns",
           "src/transport/store/host_store.cc",
           [("  if (!encoder_.joinable()) return Encode(slot, base->slot);",
             "  return Encode(slot, base->slot);")],
           "core_delta_update_test", "*PublishReturnsBeforeItsDeltasAreEncoded*"),
    Mutant("encode-wait-option", "Publish(wait_for_deltas) returns before the deltas are encoded",
           "src/core/publisher.cc",
           [("  if (call.wait_for_deltas) WS_RETURN_IF_ERROR(d.AwaitDeltas(step, k));\n", "")],
           "core_delta_update_test", "*AThousandStepsLandExactly*Staged*"),
    Mutant("encode-deltas-await", "Publisher::Deltas() counts an encode still running",
           "src/core/publisher.cc",
           [("      d.store->AwaitDelta(static_cast<uint32_t>(slot), Deadline(d.options.timeout)));",
             "      Result<const transport::store::SlotDelta*>("
             "d.store->delta(static_cast<uint32_t>(slot))));")],
           "core_delta_update_test", "*DeltasWaitsForTheEncode*"),
    Mutant("encode-whole-waits", "a session sending the step whole waits for the step's encode",
           "src/core/publisher.cc",
           [("    if (delta == nullptr || base_step < 0 || delta->base_step != base_step) return nullptr;\n"
             "    return store->AwaitDelta(pin.begin.slot, deadline);",
             "    WS_ASSIGN_OR_RETURN(delta, store->AwaitDelta(pin.begin.slot, deadline));\n"
             "    if (delta == nullptr || base_step < 0 || delta->base_step != base_step) return nullptr;\n"
             "    return delta;")],
           "core_delta_update_test", "*ASubscriberTakingTheStepWholeNeverWaits*"),
    Mutant("encode-late-fails", "an encode outlasting half of the session's time fails the step "
           "(Timeout) instead of sending it whole",
           "src/transport/path/tcp_delivery.cc",
           [("        } else if (awaited.status().code() != StatusCode::kTimeout) {",
             "        } else if (true) {")],
           "core_delta_update_test", "*AnEncodeOutlastingHalfTheSessionsTime*"),
    Mutant("nvfp4-nan-scale", "an NVFP4 block holding a NaN keeps a numeric scale (dequantizes to "
           "plausible numbers)",
           "src/cuda/block_scaled_reference.cc",
           [("amax.nan ? 0x7F : scale", "scale")],
           "cuda_block_scaled_reference_test", "*ABlockWithANaNGetsANaNScale*"),
    Mutant("nvfp4-overflowing-encode", "an NVFP4 tensor scale whose 6*448/amax overflows is used",
           "src/cuda/block_scaled_reference.cc",
           [(" || !std::isfinite(encode))", ")")],
           "cuda_block_scaled_reference_test", "*ZeroInfiniteAndTinyTensors*"),
    Mutant("block-scaled-dtype", "the block-scaled references take a float16 input as float32",
           "src/cuda/block_scaled_reference.cc",
           [("  if (from != DType::kBFloat16 && from != DType::kFloat32) {",
             "  if (false) {")],
           "cuda_block_scaled_reference_test", "*RefusesOtherInputTypes*"),
    Mutant("block-scaled-layout", "a host landing writes every block-scaled scale row-major, "
           "whatever layout the destination named",
           "src/transport/path/host_landing.cc",
           [("  const cuda::ScaleLayout layout = plan::ScaleLayoutOf(t.scale_layout);",
             "  const cuda::ScaleLayout layout = cuda::ScaleLayout::kRowMajor;")],
           "core_block_scaled_round_trip_test", "*ValuesAndScalesEqualTheReference*shm_staged*"),
    Mutant("block-scaled-global", "a host landing never writes NVFP4's global scale",
           "src/transport/path/host_landing.cc",
           [("  std::memcpy(global, &global_scale, sizeof(global_scale));\n", "")],
           "core_block_scaled_round_trip_test", "*ValuesAndScalesEqualTheReference*tcp_in_place*"),
    Mutant("block-scaled-scale-shape", "the plan accepts a scale tensor of the wrong layout's shape",
           "src/plan/block_scaled_plan.cc",
           [("      (scale.shape.size() == 1 || (scale.shape.size() >= 2 && scale.shape.back() == shape.cols));",
             "      true;")],
           "plan_convert_plan_test", "*ScaleTensorsOfTheWrongSize*"),
    Mutant("block-scaled-scale-rows", "the plan accepts a scale tensor with too few bytes for the "
           "layout (the landing then writes past it)",
           "src/plan/block_scaled_plan.cc",
           [("      scale.nbytes == static_cast<uint64_t>(shape.bytes()) &&", "      true &&")],
           "plan_convert_plan_test", "*ScaleTensorsOfTheWrongSize*"),
    Mutant("block-scaled-global-size", "the plan accepts an NVFP4 global scale that is not 4 bytes",
           "src/plan/block_scaled_plan.cc",
           [(" || global.nbytes != 4)", ")")],
           "plan_convert_plan_test", "*ScaleTensorsOfTheWrongSize*"),
    Mutant("block-scaled-alias", "two tensors may write one scale tensor through an alias",
           "src/plan/plan.cc",
           [("        if (destinations[aux].alias_of != kNoDestination) aux = destinations[aux].alias_of;\n", "")],
           "plan_convert_plan_test", "*ScaleTensorsOfTheWrongSize*"),
    Mutant("scale-published-alias", "a published tensor registered at another tensor's scale "
           "memory (an alias) is not caught",
           "src/plan/plan.cc",
           [("      published_into[destinations[d].alias_of] = true;\n", "")],
           "plan_convert_plan_test", "*ScaleTensorsOfTheWrongSize*"),
    Mutant("converted-stats-up-to-date",
           "an up-to-date update reports conversions it did not run",
           "src/core/subscriber.cc",
           [("    WS_RETURN_IF_ERROR(MoveStep(run, step));\n"
             "    for (const Source* src : active) {",
             "    WS_RETURN_IF_ERROR(MoveStep(run, step));\n  }\n  {\n"
             "    for (const Source* src : active) {")],
           "core_block_scaled_round_trip_test", "*ValuesAndScalesEqualTheReferenceStepAfterStep*"),
    Mutant("block-scaled-publishers", "a block-scaled destination is scheduled from several publishers",
           "src/plan/schedule.cc",
           [("      if (destinations[it->second].quantization.format != Quantization::Format::kNone) {",
             "      if (false) {")],
           "plan_schedule_test", "*ABlockScaledDestinationFromSeveralPublishers*"),
    Mutant("block-scaled-regions", "a block-scaled destination filled by regions is registered",
           "src/core/destination_set.cc",
           [("    if (tensors[i].quantization.format != Quantization::Format::kNone &&\n"
             "        !tensors[i].regions.empty()) {",
             "    if (false) {")],
           "core_block_scaled_round_trip_test", "*ADestinationFilledByRegionsIsRefused*"),
    Mutant("delta-commit-whole", "a sparse staged commit leaves out the segments that came whole",
           "src/transport/path/delta_receiver.cc",
           [("  landing_->CommitSegments(whole_segments_);\n", "")],
           "core_delta_update_test", "*AThousandStepsLandExactly*Staged*"),
    Mutant("delta-commit-deltas", "a sparse staged commit leaves out the deltas",
           "src/transport/path/delta_receiver.cc",
           [("  ApplyDeltas(/*to_destinations=*/true);\n", "")],
           "core_delta_update_test", "*AThousandStepsLandExactly*Staged*"),
    Mutant("delta-held-version", "deltas are asked for onto weights a weights check found different",
           "src/transport/transport.cc",
           [("      after_step >= 0 && base_digests.size()", "      base_digests.size()")],
           "core_delta_update_test", "*AStagedCommitWritesOnlyWhatChanged*"),
    Mutant("delta-fresh-handle", "a handle that committed nothing yet (after a failure, a restart, "
           "sleep) applies deltas onto what its shadow or the weights hold",
           "src/transport/path/tcp_read_path.h",
           [("return reader_.AcceptsDeltas(committed_here_);",
             "return reader_.AcceptsDeltas(true);")],
           "core_delta_update_test",
           "*NoDeltaOntoWeightsAFailedUpdateLeftInvalid*:*AfterSleep*:*NoDeltaAcrossAPublisherRestart*"),
    # The tcp-to-gpu mutants need a GPU: BUILD=build-gpu on the GPU machine (docs/ci.md).
    Mutant("tcp-gpu-fresh-handle", "tcp-to-gpu applies deltas onto a mirror that holds no base "
           "(a handle prepared again after sleep)",
           "src/transport/path/tcp_to_gpu_path.h",
           [("return reader_.AcceptsDeltas(committed_here_);",
             "return reader_.AcceptsDeltas(true);")],
           "gpu_tcp_to_gpu_test", "*AfterSleepTheFirstStepComesWhole*"),
    Mutant("tcp-gpu-second-hop", "tcp-to-gpu does not check what landed on the GPU against the "
           "mirror",
           "src/transport/path/tcp_to_gpu_path.cc",
           [("  Status s = receiver_.Verify(gpu_kind_, step, deadline);",
             "  Status s = Status::Ok();")],
           "gpu_tcp_to_gpu_test", "*TheCopyToTheGpuIsCheckedAgainstTheMirror*"),
    Mutant("tcp-gpu-converted-deltas", "tcp-to-gpu takes converted tensors whole only",
           "src/transport/path/tcp_to_gpu_path.cc",
           [("/*keeps_converted_bytes=*/true", "/*keeps_converted_bytes=*/false")],
           "gpu_tcp_to_gpu_test", "*ConvertedTensorsTakeDeltas*"),
    Mutant("delta-option-off", "SubscriberOptions::delta false still asks for deltas",
           "src/core/subscriber.cc",
           [("    const bool delta = options.delta;", "    const bool delta = true;")],
           "core_delta_update_test", "*EitherSideCanTurnDeltasOff*"),
    Mutant("delta-publisher-base", "the publisher sends deltas against a base the subscriber does not hold",
           "src/core/publisher.cc",
           [(" || delta->base_step != base_step) return nullptr;", ") return nullptr;")],
           "core_delta_update_test", "*AMissedStepComesWhole*"),
    Mutant("relay-prepare-check", "a relay starts receiving a version it cannot serve",
           "src/core/subscriber.cc",
           [("        s = core::RelayServe::CheckServable(*active[0]->welcome, registered.destinations());\n"
             "        if (!s.ok()) return Fail(run, s);\n", "")],
           "core_relay_test", "*ARelayHoldingPartOfTheVersionIsRefused*"),
    Mutant("relay-servable-names", "a relay takes a version with a published tensor it does not hold",
           "src/core/relay_serve.cc",
           [("    if (it == by_name.end()) return refuse(p.spec.name, \"is not registered here\");\n",
             "    if (it == by_name.end()) continue;\n")],
           "core_relay_test", "Relay.ServesTheWholeVersionAsPublished*"),
    Mutant("relay-one-device", "a relay takes destinations on more than one device (one store serves)",
           "src/core/relay_serve.cc",
           [("    if (d.device != first->device) {", "    if (false) {")],
           "core_relay_test", "Relay.ServesTheWholeVersionAsPublished*"),
    Mutant("relay-gpu-digests", "a relay of CUDA destinations takes a host publisher's xxh3 digests",
           "src/core/relay_serve.cc",
           [("  if (on_gpu && upstream.digest_kind != wire::DigestKind::kGpu64) {", "  if (false) {")],
           "core_relay_test", "Relay.ServesTheWholeVersionAsPublished*"),
    Mutant("relay-host-digests", "a host relay takes a GPU publisher's digests",
           "src/core/relay_serve.cc",
           [("  if (!on_gpu && upstream.digest_kind != wire::DigestKind::kXxh3) {", "  if (false) {")],
           "core_relay_test", "Relay.ServesTheWholeVersionAsPublished*"),
    Mutant("relay-new-session", "a relay serves a restarted trainer's session under the old one",
           "src/core/relay_serve.cc",
           [("  if (adopted_ && session_ != upstream.session_id) return", "  if (false) return")],
           "core_relay_test", "*ATrainerRestartFlowsDownTheChain*"),
    Mutant("relay-served-step", "a relay hands over a step it already serves (and fails doing so)",
           "src/core/relay_serve.cc",
           [("  if (step <= publisher_->latest_step()) {\n    // Up to date", "  if (false) {\n    // Up to date")],
           "core_relay_test", "*AFailedHandOverIsLoggedAndRetried*"),
    Mutant("relay-same-sources", "a relay keeps copying from memory its engine registered anew",
           "src/core/relay_serve.cc",
           [("  if (registered && !SameSources(destinations)) return", "  if (false) return")],
           "core_relay_test", "*ARelayThatRegisteredNewMemoryServesFromIt*"),
    Mutant("relay-recommit", "a relay keeps serving its old copy of a step it committed again",
           "src/core/relay_serve.cc",
           [("  if (registered && moved && step <= publisher_->latest_step()) {",
             "  if (false) {")],
           "core_relay_test", "*RewritingTheCommittedStepServesItAnew*"),
    Mutant("relay-serve-before-check", "a relay serves a step before its weights check passed",
           "src/core/subscriber.cc",
           [("  if (update.check_weights) WS_RETURN_IF_ERROR(CheckAfterCommit(run.deadline, &stats));\n",
             "  ServeCommitted(&stats, !stats.up_to_date, Deadline(options.timeout, &cancel));\n"
             "  if (update.check_weights) WS_RETURN_IF_ERROR(CheckAfterCommit(run.deadline, &stats));\n")],
           "core_relay_test", "*ARelayNeverServesAStepItsWeightsCheckRefused*"),
    Mutant("relay-retry", "an up-to-date update does not hand over a step a failed hand-over left",
           "src/core/subscriber.cc",
           [("  ServeCommitted(&stats, /*moved=*/!stats.up_to_date, Deadline(options.timeout, &cancel));",
             "  if (!stats.up_to_date) ServeCommitted(&stats, true, Deadline(options.timeout, &cancel));")],
           "core_relay_test", "*AFailedHandOverIsLoggedAndRetried*"),
    Mutant("relay-writer-deadline", "a relay's hand-over waits for a stalled child past its own update",
           "src/transport/store/version_slots.cc",
           [("(writer != nullptr && (writer->expired() || writer->cancelled()))", "false")],
           "core_relay_test", "*AStalledChildNeverHoldsItsRelayPastItsOwnUpdate*"),
    Mutant("members-left", "a subscriber that left stays in the publisher's membership",
           "src/core/publisher.cc",
           [("    std::erase_if(members, [&](const Member& m) { return m.id == member; });\n", "")],
           "core_relay_test", "*MembershipSaysWhoHoldsWhichStepAtEachLevel*"),
    Mutant("relay-digest-count", "a relayed version is published with fewer digests than segments",
           "src/core/publisher.cc",
           [("  if (given != nullptr) WS_RETURN_IF_ERROR(d.CheckGiven(step, given->size()));",
             "")],
           "core_relay_test", "Relay.ItsPublisherTakesAnIdentity*"),
    Mutant("cut-through-off", "tcp sessions never pin a version still landing (no cut-through)",
           "src/transport/store/version_slots.cc",
           [("if (target >= 0 && (landing_ok || versions_[target].progress == nullptr)) {",
             "if (target >= 0 && versions_[target].progress == nullptr) {")],
           "core_relay_cut_through_test", "*AChildHasTheStepsBytesBeforeItsRelayCommittedIt*"),
    Mutant("cut-shm-landing", "a reader of the mapped store is given a version still landing",
           "src/transport/store/version_slots.cc",
           [("if (target >= 0 && (landing_ok || versions_[target].progress == nullptr)) {",
             "if (target >= 0) {")],
           "core_relay_cut_through_test", "*ASharedMemoryChildWaitsForTheStepWhole*"),
    Mutant("cut-stale-delta", "a slot written by cut-through keeps the delta of its old version",
           "src/transport/store/host_store.cc",
           [("    BeginDelta(slot, nullptr);\n    return arena_->slot(slot);",
             "    return arena_->slot(slot);")],
           "core_relay_cut_through_test", "*AStreamedStepNeverCarriesTheDeltaItsSlotHeldBefore*"),
    Mutant("cut-no-abort", "a failed relay update leaves the step it streamed landing forever",
           "src/core/subscriber.cc",
           [("      if (relay != nullptr && relay->streaming()) {",
             "      if (false) {")],
           "core_relay_cut_through_test", "*ARelayWhoseUpdateFailsMidStepFailsItsChildren*"),
    Mutant("cut-latest-kept", "a stream given up stays the latest version",
           "src/transport/store/version_slots.cc",
           [("      latest_ = kept ? before_stream_ : -1;\n      latest_step_ = kept ? before_stream_step_ : -1;",
             "      (void)kept;")],
           "core_relay_cut_through_test", "*ARelayWhoseUpdateFailsMidStepFailsItsChildren*"),
    Mutant("cut-waits-in-read", "the relay waits for a stalled child's slot inside its own read",
           "src/core/publisher.cc",
           [("  const int taken = d.versions.TakeIdle();",
             "  const int taken = static_cast<int>(d.versions.TakeForWrite(step, &d.waited));")],
           "core_relay_cut_through_test", "*AStalledChildNeverFailsItsRelaysUpdate*"),
    Mutant("cut-any-step", "a session waits on the progress of whatever step its slot streams now",
           "src/transport/store/stream_progress.cc",
           [("  if (step != step_) {\n    return Status::Unavailable(", "  if (false) {\n    return Status::Unavailable(")],
           "transport_store_stream_progress_test", "*AWaitForAnotherStepFailsAtOnce*"),
    Mutant("cut-failed-not-revoked", "readers of a stream given up may still unpin it whole",
           "src/transport/store/version_slots.cc",
           [("    v.writing = false;\n    RevokeReaders(&v);\n", "    v.writing = false;\n")],
           "transport_store_version_slots_test", "*AStreamingVersionIsPinnedWholeOnly*"),
    Mutant("relay-adopt-frozen", "a relay's publisher changes identity while serving",
           "src/core/publisher.cc",
           [("  if (d.frozen) {\n    return Status::FailedPrecondition(\"relay \", d.bound_endpoint, \": cannot take",
             "  if (false) {\n    return Status::FailedPrecondition(\"relay \", d.bound_endpoint, \": cannot take")],
           "core_relay_test", "Relay.ItsPublisherTakesAnIdentity*"),
    Mutant("topology-avoid", "a replica is redirected back to the relay it just lost a step through",
           "src/core/publisher.cc",
           [("serves.empty() || serves == hello.avoid || ", "serves.empty() || ")],
           "core_relay_topology_test", "*AReplicaIsNotSentBackToTheRelayItLost*"),
    Mutant("topology-self", "a relay is redirected to the endpoint it announces itself by",
           "src/core/publisher.cc",
           [(" || serves == hello.serves;", ";")],
           "core_relay_topology_test", "*ARelayIsNeverRedirectedToTheEndpointItAnnounces*"),
    Mutant("topology-bound", "a publisher serves past its max_direct while a relay has room",
           "src/core/publisher.cc",
           [("    if (options.max_direct > 0 && members.size() >= static_cast<size_t>(options.max_direct)) {",
             "    if (false) {")],
           "core_relay_topology_test", "*NewcomersPastTheBoundFormATree*"),
    Mutant("topology-spread", "newcomers pile onto one relay until it next reports its subtree",
           "src/core/publisher.cc",
           [("      consider({&m, nullptr}, near(m.info.locality), 1, m.info.below + sent,",
             "      consider({&m, nullptr}, near(m.info.locality), 1, m.info.below,")],
           "core_relay_topology_test", "*ABurstOfNewcomersIsSpread*"),
    Mutant("topology-remember", "a failed update does not remember the relay it went through",
           "src/core/subscriber.cc",
           [("  if (run.touched_destinations) valid.store(false, std::memory_order_relaxed);\n  AvoidRelays();\n",
             "  if (run.touched_destinations) valid.store(false, std::memory_order_relaxed);\n")],
           "core_relay_topology_test", "*AReplicaIsNotSentBackToTheRelayItLost*"),
    Mutant("topology-hops", "a subscriber follows redirects in a loop until its deadline",
           "src/transport/transport.cc",
           [("    if (hops >= wire::kMaxRedirects) {", "    if (false) {")],
           "core_relay_topology_test", "RelayRedirect.ARedirectLoopEndsInAClearError*"),
    Mutant("topology-dial", "a dead relay it was sent to costs a subscriber its whole deadline",
           "src/transport/transport.cc",
           [("    if (!relay_.empty()) link_->set_dial_bound(kRelayDialBound);\n", "")],
           "core_relay_topology_test", "RelayRedirect.ARelayThatIsNotThere*"),
    Mutant("topology-endpoint-text", "a peer's endpoint text may hold control bytes",
           "src/wire/codec.cc",
           [("    if ((c == 0x20 && spaces) || (c > 0x20 && c < 0x7f)) continue;",
             "    continue;")],
           "wire_messages_test", "WireHelloTest.EndpointsAreBounded*:WireRedirectTest.*"),
    Mutant("topology-wildcard", "a relay bound to a wildcard address is announced by it",
           "src/core/relay_serve.cc",
           [("  if (wildcard) {", "  if (false) {")],
           "core_relay_topology_test", "RelayAnnounce.*"),
    Mutant("topology-locality", "a newcomer is placed by load alone, ignoring its locality",
           "src/core/publisher.cc",
           [("      const std::tuple<bool, uint32_t, int64_t> key{!is_near, depth, load};",
             "      const std::tuple<bool, uint32_t, int64_t> key{false, depth, load};")],
           "core_relay_topology_test", "*NewcomersGoToARelayOfTheirOwnLocalityFirst*"),
    Mutant("topology-locality-text", "a locality the Hello cannot carry is accepted at Create",
           "src/core/subscriber.cc",
           [("  if (Status s = CheckLocality(options.locality); !s.ok()) return s;\n", "")],
           "core_relay_topology_test", "RelayAnnounce.TopologyOptionsAreCheckedAtCreate"),
]


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, **kw)


def check(m: Mutant, build: str, jobs: str) -> str:
    path = ROOT / m.path
    original = path.read_text()
    mutated = original
    for old, new in m.edits:
        if mutated.count(old) != 1:
            return f"NO LONGER APPLIES ({m.path}: a piece occurs {mutated.count(old)} times)"
        mutated = mutated.replace(old, new)
    try:
        path.write_text(mutated)
        built = run(["cmake", "--build", build, "-j", jobs, "--target", m.target],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if built.returncode != 0:
            return "DOES NOT BUILD:\n" + built.stdout[-2000:]
        try:
            tested = run([f"{build}/tests/{m.target}", f"--gtest_filter={m.tests}",
                          "--gtest_brief=1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=m.timeout)
        except subprocess.TimeoutExpired:
            return f"killed: its tests hung past {m.timeout} s"
        if tested.returncode == 0 and "[  PASSED  ] 0 tests." in tested.stdout:
            return "NOT RUN (its tests skip here: the gpu_ ones need a CUDA device)"
        if tested.returncode == 0:
            return "SURVIVED (its tests pass)"
        failed = [line for line in tested.stdout.splitlines() if line.startswith("[  FAILED  ]")]
        return "killed: " + (failed[0][13:] if failed else f"exit {tested.returncode}")
    finally:
        path.write_text(original)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:18} {m.why}")
        return 0
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    build, jobs = os.environ.get("BUILD", "build"), os.environ.get("JOBS", "2")
    survivors = not_run = 0
    for m in chosen:
        result = check(m, build, jobs)
        not_run += result.startswith("NOT RUN")
        survivors += not result.startswith(("killed", "NOT RUN"))
        print(f"{m.name:18} {result}", flush=True)
    # The sources are restored; so are the binaries, rebuilt now: a test binary (and the library)
    # left built from the last mutant fails its tests when run directly, without a build first.
    targets = sorted({m.target for m in chosen})
    rebuilt = run(["cmake", "--build", build, "-j", jobs]
                  + [arg for t in targets for arg in ("--target", t)],
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if rebuilt.returncode != 0:
        print("rebuilding from the restored sources failed:\n" + rebuilt.stdout[-2000:])
        return 1
    print(f"{len(chosen) - survivors - not_run} of {len(chosen)} mutants killed"
          + (f", {not_run} not run (no CUDA device)" if not_run else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
