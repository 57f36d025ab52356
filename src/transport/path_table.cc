#include "transport/path_table.h"

#include <string>

#include "transport/path/gpu_copy_path.h"
#include "transport/path/gpu_to_host_path.h"
#include "transport/path/host_copy_path.h"
#include "transport/path/host_to_gpu_path.h"
#include "transport/path/nccl_path.h"
#include "transport/path/tcp_delivery.h"
#include "transport/path/tcp_read_path.h"
#include "transport/path/tcp_to_gpu_path.h"

namespace weightsync::transport {
namespace {

using link::LinkKind;
using wire::ArenaKind;

template <typename Path>
std::unique_ptr<path::DataPath> Make() {
  return std::make_unique<Path>();
}

template <LinkKind kLink, ArenaKind kStore, DestinationKind kDestinations>
bool Serves(LinkKind link, ArenaKind store, DestinationKind destinations) {
  return link == kLink && store == kStore && destinations == kDestinations;
}

// A host store or a host ring's publisher: over tcp both stream the version on the connection.
template <DestinationKind kDestinations>
bool ServesTcp(LinkKind link, ArenaKind store, DestinationKind destinations) {
  return link == LinkKind::kTcp &&
         (store == ArenaKind::kHostMemfd || store == ArenaKind::kHostRing) &&
         destinations == kDestinations;
}

constexpr PathEntry kPaths[] = {
    {"shm", "host store -> host memory: CPU threads copy from the store mapped read-only",
     &Serves<LinkKind::kUnix, ArenaKind::kHostMemfd, DestinationKind::kHost>,
     &Make<path::HostCopyPath>},
    {"shm-ring",
     "ring of host buckets -> host memory: CPU threads copy each bucket as the publisher fills "
     "it from its tensors",
     &Serves<LinkKind::kUnix, ArenaKind::kHostRing, DestinationKind::kHost>,
     &Make<path::HostCopyPath>},
    {"host-to-gpu", "host store -> one CUDA device: the copy engines read the store, pinned once",
     &Serves<LinkKind::kUnix, ArenaKind::kHostMemfd, DestinationKind::kCuda>,
     &Make<path::HostToGpuPath>},
    {"host-to-gpu-ring",
     "ring of host buckets -> one CUDA device: the copy engines read each bucket, pinned once, "
     "as the publisher fills it from its tensors",
     &Serves<LinkKind::kUnix, ArenaKind::kHostRing, DestinationKind::kCuda>,
     &Make<path::HostToGpuPath>},
    {"gpu-to-host",
     "GPU store -> host memory: the store's GPU copy engines write pinned host memory",
     &Serves<LinkKind::kUnix, ArenaKind::kCudaMem, DestinationKind::kHost>,
     &Make<path::GpuToHostPath>},
    {"gpu-to-host-ring",
     "ring of GPU buckets -> host memory: the ring's GPU copy engines write pinned host memory, "
     "a bucket at a time as the publisher fills it from its tensors",
     &Serves<LinkKind::kUnix, ArenaKind::kCudaRing, DestinationKind::kHost>,
     &Make<path::GpuToHostPath>},
    {"cuda-ipc", "GPU store -> one CUDA device: copy-engine batches from the imported store",
     &Serves<LinkKind::kUnix, ArenaKind::kCudaMem, DestinationKind::kCuda>,
     &Make<path::GpuCopyPath>},
    {"cuda-ipc-zero-copy",
     "zero-copy GPU tensors -> one CUDA device: copy-engine batches from the "
     "publisher's own allocations, opened by IPC handle",
     &Serves<LinkKind::kUnix, ArenaKind::kCudaIpc, DestinationKind::kCuda>,
     &Make<path::GpuCopyPath>},
    {"cuda-ipc-ring",
     "ring of GPU buckets -> one CUDA device: a copy-engine batch per bucket from the imported "
     "ring as the publisher fills it from its tensors",
     &Serves<LinkKind::kUnix, ArenaKind::kCudaRing, DestinationKind::kCuda>,
     &Make<path::GpuCopyPath>},
    {"tcp",
     "host store -> host memory: the bytes stream on the connection into place (from a ring "
     "publisher, straight from its tensors); from an arena, only what changed when the "
     "destinations hold the version before (deltas)",
     &ServesTcp<DestinationKind::kHost>, &Make<path::TcpReadPath>, &path::DeliverOnSocket},
    {"tcp-to-gpu",
     "host store -> one CUDA device: the bytes stream on the connection into a pinned host "
     "mirror (from an arena, only what changed: deltas applied there), then the copy engines "
     "move it to the GPU",
     &ServesTcp<DestinationKind::kCuda>, &Make<path::TcpToGpuPath>, &path::DeliverOnSocket},
    {"nccl", "GPU store -> one CUDA device: grouped broadcasts over a two-rank communicator",
     &Serves<LinkKind::kTcp, ArenaKind::kCudaMem, DestinationKind::kCuda>, &Make<path::NcclPath>,
     &path::DeliverOverNccl},
    {"nccl-zero-copy",
     "zero-copy GPU tensors -> one CUDA device: grouped broadcasts over a two-rank communicator, "
     "read from the publisher's own tensors",
     &Serves<LinkKind::kTcp, ArenaKind::kCudaIpc, DestinationKind::kCuda>, &Make<path::NcclPath>,
     &path::DeliverOverNccl},
    {"nccl-ring",
     "ring publisher of GPU tensors -> one CUDA device: grouped broadcasts over a two-rank "
     "communicator, read from its tensors (no bucket: NCCL's buffers bound what is in flight)",
     &Serves<LinkKind::kTcp, ArenaKind::kCudaRing, DestinationKind::kCuda>, &Make<path::NcclPath>,
     &path::DeliverOverNccl},
};

std::string StoreText(const wire::Welcome& welcome) {
  switch (welcome.arena_kind) {
    case ArenaKind::kCudaMem:
      return "GPU memory (cuda:" + std::to_string(welcome.device) + ")";
    case ArenaKind::kCudaIpc:
      return "its own GPU tensors (zero-copy, cuda:" + std::to_string(welcome.device) + ")";
    case ArenaKind::kHostRing:
      return "a ring of buckets in host memory";
    case ArenaKind::kCudaRing:
      return "a ring of buckets in GPU memory (cuda:" + std::to_string(welcome.device) + ")";
    default:
      return "host memory";
  }
}

// "destination 'w' is on cpu", or for a mix the first destination of each kind.
std::string WhereText(const std::vector<plan::Destination>& destinations) {
  if (destinations.empty()) return "no destinations";
  std::string text = "destination '" + destinations[0].spec.name + "' is on " +
                     DeviceString(destinations[0].device);
  for (const plan::Destination& d : destinations) {
    if (d.device != destinations[0].device) {
      text += ", '" + d.spec.name + "' is on " + DeviceString(d.device);
      break;
    }
  }
  return text;
}

}  // namespace

DestinationKind KindOf(const std::vector<plan::Destination>& destinations) {
  if (destinations.empty() || !destinations[0].device.is_cuda()) {
    for (const plan::Destination& d : destinations) {
      if (d.device.is_cuda()) return DestinationKind::kMixed;
    }
    return DestinationKind::kHost;
  }
  for (const plan::Destination& d : destinations) {
    if (d.device != destinations[0].device) return DestinationKind::kMixed;
  }
  return DestinationKind::kCuda;
}

std::span<const PathEntry> PathTable() { return kPaths; }

Result<const PathEntry*> ChoosePath(const link::Link& link, const wire::Welcome& welcome,
                                    const std::vector<plan::Destination>& destinations) {
  if (link.kind() == LinkKind::kUnix && welcome.arena_kind == ArenaKind::kNone) {
    return Status::ProtocolError(link.peer(), ": welcome on a local socket names no arena");
  }
  // A zero-copy layout without allocations is the one made for tcp (nothing exported): on this
  // host the subscriber would have nothing to open.
  if (link.kind() == LinkKind::kUnix && welcome.arena_kind == ArenaKind::kCudaIpc &&
      welcome.allocations.empty() && welcome.direct_bytes > 0) {
    return Status::ProtocolError(link.peer(),
                                 ": zero-copy welcome on a local socket names none of the "
                                 "publisher's CUDA allocations");
  }
  const DestinationKind kind = KindOf(destinations);
  for (const PathEntry& entry : kPaths) {
    if (entry.can_serve(link.kind(), welcome.arena_kind, kind)) return &entry;
  }
  const char* into = kind == DestinationKind::kHost   ? "host memory"
                     : kind == DestinationKind::kCuda ? "CUDA tensors"
                                                      : "host and CUDA memory at once";
  return Status::NotSupported(link.peer(), " keeps its arena in ", StoreText(welcome),
                              "; no data path moves it over ", link::LinkKindName(link.kind()),
                              " into ", into, ": ", WhereText(destinations),
                              " (weightsync info lists the paths)");
}

Result<std::unique_ptr<link::StepDelivery>> DeliverOverTcp(link::Channel& ch,
                                                           const link::SessionConfig& config,
                                                           const wire::Welcome& welcome,
                                                           int store_fd,
                                                           const wire::Select& select) {
  for (const PathEntry& entry : kPaths) {
    if (entry.deliver == nullptr) continue;
    for (DestinationKind into : {DestinationKind::kHost, DestinationKind::kCuda}) {
      if (entry.can_serve(LinkKind::kTcp, welcome.arena_kind, into)) {
        return entry.deliver(ch, config, welcome, store_fd, select);
      }
    }
  }
  return Status::FailedPrecondition("no data path sends ", StoreText(welcome), " over tcp");
}

}  // namespace weightsync::transport
