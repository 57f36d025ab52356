// TcpReadPath: a publisher's host store on another host (or this one) into host destinations: the
// publisher streams the selected tensors' bytes on the connection, and one scatter-gather read per
// step puts them straight into staging or the destinations (host landing). No staging copy.
// Asked for deltas (docs/deltas.md), a step's segments come as deltas where the publisher has them
// and are applied onto the committed version where it lands (delta_receiver.h).
#pragma once

#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"
#include "transport/path/tcp_step_reader.h"

namespace weightsync::transport::path {

class TcpReadPath final : public DataPath {
 public:
  ~TcpReadPath() override;
  Status Prepare(const PathContext& ctx) override;
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override;
  Status Commit(const util::Deadline& deadline) override;
  bool AcceptsDeltas() const override { return reader_.AcceptsDeltas(committed_here_); }
  void ExpectDeltas(int64_t base_step, std::span<const uint64_t> base_digests) override {
    reader_.ExpectDeltas(base_step, base_digests);
  }
  void ObserveLanding(LandingObserver* observer) override { observer_ = observer; }
  DeltaReceipt delta_receipt() const override { return reader_.receipt(); }
  uint64_t staging_bytes() const override {
    return landing_.staging_bytes() + reader_.deltas().buffer_bytes();
  }
  ConversionReport conversion() const override { return landing_.conversion(); }
  Status Release() override;

 private:
  wire::DigestKind digest_kind_ = wire::DigestKind::kXxh3;
  HostLanding landing_;
  TcpStepReader reader_;  // deltas when DeltaReceiver::Fits the plan
  LandingObserver* observer_ = nullptr;
  bool staged_ = false;
  // The last Copy was committed through this handle, and no Copy began since: the shadow
  // (staged) holds the committed version, which deltas apply to. Not merely "the core says the
  // weights are valid": after Sleep() an engine may have dropped and reloaded its weights at the
  // same addresses, so a handle prepared again takes one whole step first, in both modes.
  bool committed_here_ = false;
};

}  // namespace weightsync::transport::path
