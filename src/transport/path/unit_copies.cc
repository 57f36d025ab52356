#include "transport/path/unit_copies.h"

namespace weightsync::transport::path {

std::vector<cuda::CopyBatch> UnitCopyBatches(
    const view::StoreView& view, const wire::Welcome& welcome, const plan::Plan& plan,
    util::FunctionRef<uint8_t*(const plan::PlannedTensor&)> received) {
  std::vector<cuda::CopyBatch> batches(view.units());
  std::vector<view::Piece> cut;
  for (uint32_t u = 0; u < view.units(); ++u) {
    for (const plan::PlannedTensor& t : plan.tensors) {
      const wire::TensorPlacement& p = welcome.tensors[t.publisher_index];
      cut.clear();
      view.Cut(u, p.region, p.offset + t.src_offset, t.nbytes, 0, &cut);
      for (const view::Piece& piece : cut) {
        batches[u].Add(received(t) + piece.at, piece.src, piece.bytes, t.destination);
      }
    }
  }
  return batches;
}

}  // namespace weightsync::transport::path
