// Docs that cannot drift: docs/architecture.md (where a byte goes) and docs/python.md (the path
// names UpdateStats.path reports, the stores a Publisher may choose) name every row of the path
// table and of the store table, as knobs_test.cc holds docs/env_vars.md to the knobs. A row added
// without its docs fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "transport/path_table.h"
#include "transport/store/store_table.h"

namespace weightsync {
namespace {

std::string ReadDoc(const std::string& name) {
  std::ifstream in(std::string(WS_SOURCE_DIR) + "/docs/" + name);
  EXPECT_TRUE(in) << "docs/" << name << " not found under " << WS_SOURCE_DIR;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The names `doc` never mentions as code (`name` or "name" inside backticks).
std::vector<std::string> Unnamed(const std::string& doc, const std::vector<std::string>& names) {
  std::vector<std::string> missing;
  for (const std::string& name : names) {
    if (doc.find("`" + name + "`") == std::string::npos &&
        doc.find("\"" + name + "\"") == std::string::npos) {
      missing.push_back(name);
    }
  }
  return missing;
}

std::vector<std::string> PathNames() {
  std::vector<std::string> names;
  for (const transport::PathEntry& e : transport::PathTable()) names.emplace_back(e.name);
  return names;
}

TEST(DocsDrift, TheCheckFindsARowADocLeavesOut) {  // the gate's canary
  EXPECT_EQ(Unnamed("| `shm` | ... `tcp`", {"shm", "tcp", "nccl"}),
            std::vector<std::string>{"nccl"});
  EXPECT_EQ(Unnamed("(`\"shm\"`)", {"shm"}), std::vector<std::string>{});
  EXPECT_EQ(Unnamed("shm-ring", {"shm"}), std::vector<std::string>{"shm"}) << "a substring";
}

TEST(DocsDrift, ArchitectureNamesEveryPathTableRow) {
  EXPECT_EQ(Unnamed(ReadDoc("architecture.md"), PathNames()), std::vector<std::string>{});
}

std::vector<std::string> StoreNames() {
  std::vector<std::string> names;
  for (const transport::store::StoreEntry& e : transport::store::StoreTable()) {
    names.emplace_back(e.name);
  }
  return names;
}

TEST(DocsDrift, ArchitectureNamesEveryStoreTableRow) {
  EXPECT_EQ(Unnamed(ReadDoc("architecture.md"), StoreNames()), std::vector<std::string>{});
}

TEST(DocsDrift, PythonDocsNameEveryStore) {
  EXPECT_EQ(Unnamed(ReadDoc("python.md"), StoreNames()), std::vector<std::string>{});
}

TEST(DocsDrift, PythonDocsNameEveryPathUpdateStatsReports) {
  EXPECT_EQ(Unnamed(ReadDoc("python.md"), PathNames()), std::vector<std::string>{});
}

}  // namespace
}  // namespace weightsync
