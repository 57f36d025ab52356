// The transport conformance suite (transport/conformance_suite.h) over the host data paths — shm
// and tcp, staged and in place — which every machine runs. The GPU rows are
// tests/gpu/conformance_test.cc. The rows of both cover the path table.
#include <set>

#include "transport/conformance_suite.h"
#include "transport/path_table.h"

namespace weightsync::conformance {
namespace {

INSTANTIATE_TEST_SUITE_P(Host, Conformance, ::testing::ValuesIn(HostRows()), RowName);

// A path added to the table without a row here or in GpuRows() fails this test.
TEST(ConformanceRows, CoverEveryPathOfTheTableInBothModes) {
  std::set<std::string> table, staged, in_place;
  for (const transport::PathEntry& entry : transport::PathTable()) {
    table.insert(std::string(entry.name));
  }
  for (const std::vector<PathRow>& rows : {HostRows(), GpuRows()}) {
    for (const PathRow& row : rows) (row.staged() ? staged : in_place).insert(row.path);
  }
  EXPECT_EQ(staged, table);
  EXPECT_EQ(in_place, table);
}

}  // namespace
}  // namespace weightsync::conformance
