// The transport conformance suite (transport/conformance_suite.h) over the GPU data paths —
// host-to-gpu, gpu-to-host, cuda-ipc (one CUDA device) and nccl (two, and libnccl), staged and in
// place (label gpu; each row skips without what it needs). The host rows are
// tests/transport/conformance_test.cc.
#include "transport/conformance_suite.h"

namespace weightsync::conformance {
namespace {

INSTANTIATE_TEST_SUITE_P(Gpu, Conformance, ::testing::ValuesIn(GpuRows()), RowName);

}  // namespace
}  // namespace weightsync::conformance
