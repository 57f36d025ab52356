// UpdateStats: what one Subscriber::Update() did, returned on success.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace weightsync {

// A lineage name (PublisherOptions::lineage, at most 64 characters) held inline, so that
// returning it with every update allocates nothing.
struct LineageName {
  std::array<char, 65> chars{};  // NUL-terminated
  std::string_view view() const { return chars.data(); }
  void Assign(std::string_view name) {
    const size_t n = name.size() < chars.size() - 1 ? name.size() : chars.size() - 1;
    for (size_t i = 0; i < n; ++i) chars[i] = name[i];
    chars[n] = '\0';
  }
};

// Where an update's conversions in flight ran (UpdateStats::converted_on).
enum class ConvertedOn : uint8_t {
  kNone,            // nothing converted
  kHost,            // on the CPU (host destinations), with the reference conversions
  kDestinationGpu,  // on the destinations' GPU (UpdateStats::converted_device)
  kPublisherGpu,    // on the publisher's GPU (cuda-ipc, convert_on_publisher_gpu): only the
                    // converted bytes crossed the link
};
// "none", "host", "destination-gpu", "publisher-gpu" (static storage).
std::string_view ConvertedOnName(ConvertedOn where);

struct UpdateStats {
  int64_t step = -1;   // version now committed
  uint64_t bytes = 0;  // bytes moved into destinations
  uint64_t tensors = 0;
  double seconds = 0;  // wall time of the whole update
  double gbps = 0;     // bytes / seconds / 1e9
  // Per-phase wall time.
  double prepare_seconds = 0;   // connect + handshake + plan + map (0 when reused)
  double wait_seconds = 0;      // waiting for the step to be published
  double copy_seconds = 0;      // copying into shadow or destinations
  double verify_seconds = 0;    // digest check (0 when not verified)
  double commit_seconds = 0;    // shadow → destinations (staged), and conversions
  bool handle_created = false;  // true if this update prepared a new transfer handle
  uint64_t prepare_count = 0;   // transfer handles prepared by this subscriber so far
  bool verified = false;        // every segment matched its digest
  bool up_to_date = false;      // the latest step was already committed; nothing moved
  // The data path the bytes took, as the path table names it ("shm", "host-to-gpu",
  // "gpu-to-host", "cuda-ipc", "tcp", "nccl"; the first publisher's, with several). Static
  // storage: valid for the life of the process.
  std::string_view path;
  // The lineage of the committed version (of the first publisher, with several).
  LineageName lineage;
  // This update replaced a version of another publisher session: the publisher restarted (same
  // lineage, e.g. resumed from a checkpoint) or a new lineage took over. Logged as well.
  bool lineage_changed = false;
  // The extra memory this subscriber holds to receive, host or device memory: bytes of the
  // staging buffers its prepared transfer handles hold (all publishers', with several) — the
  // shadow of staged mode (every received tensor, each 64-byte aligned); in place only the
  // landing buffer of tensors transformed at commit (convert_dtypes, or region pieces received
  // whole), 0 when there are none or they convert straight from the publisher's GPU. Held from
  // the update that prepared them (handle_created) until Sleep(), Close() or a failed update;
  // this subscriber's share of the ledger's staging_bytes. The publisher's store, mapped or
  // imported (the ledger's mapped_bytes), is not counted.
  uint64_t staging_bytes = 0;
  // Delta updates (SubscriberOptions::delta, docs/deltas.md): the committed step the step's
  // changes were applied to (-1: no base, every byte came whole; with several publishers, the
  // first's) — a step sent against a base may still carry every segment whole, when none was
  // worth a delta (delta_segments 0); the digest segments that came as deltas, and the bytes that
  // came for the tensors (deltas plus whole segments; `bytes` when nothing came as a delta).
  int64_t delta_base_step = -1;
  uint32_t delta_segments = 0;
  uint64_t received_bytes = 0;
  // UpdateOptions::check_weights: the destinations' own memory was digested after the commit and
  // matched the committed version (Subscriber::CheckWeights), in check_seconds.
  bool weights_checked = false;
  double check_seconds = 0;
  // A relay (SubscriberOptions::serve_endpoint): the step it serves its children after this update
  // (-1 before it serves any; after a failed hand-over, logged with its cause, the step it served
  // before, or -1 when the failure came while it replaced its serving publisher), and the time
  // taken to hand the version over (the copy into its store).
  int64_t served_step = -1;
  double serve_seconds = 0;
  // Conversions in flight (SubscriberOptions::convert_dtypes, docs/quantized.md): the tensors
  // this update converted (casts, fp8 blocks, MXFP8, NVFP4 — all of its publishers'), the bytes
  // they were published in, and where they ran: converted_device is the CUDA device for
  // kDestinationGpu and kPublisherGpu (-1 otherwise). With several publishers converting in
  // different places, the first one's place. 0 / kNone when nothing moved (up to date).
  uint32_t converted_tensors = 0;
  uint64_t converted_bytes = 0;
  ConvertedOn converted_on = ConvertedOn::kNone;
  int converted_device = -1;
};

// What Subscriber::CheckWeights() compared: the destinations' own memory, digested where it lives
// (on the CPU for host tensors, with the GPU digest kernels on their device for CUDA tensors),
// against the committed version's digests from the publisher.
struct WeightsCheck {
  int64_t step = -1;     // the committed step checked against
  uint64_t tensors = 0;  // destinations every byte of which was checked
  uint64_t bytes = 0;    // bytes digested
  // Destinations with bytes no digest describes as they are: converted in flight (casts, fp8),
  // or filled from parts of digest segments (regions without verification, or region pieces
  // extracted at commit). Their received bytes were verified, if asked, before the commit.
  uint64_t unchecked_tensors = 0;
  double seconds = 0;
};

}  // namespace weightsync
