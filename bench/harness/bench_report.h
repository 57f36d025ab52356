// The bench's results: each figure with the baseline measured in the same run, printed as a table
// and written as JSON.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "weightsync/status.h"

namespace weightsync::bench {

struct Figure {
  std::string id;    // stable JSON key, e.g. "shm_update_staged_gbps"
  std::string name;  // table text
  double value = 0;
  std::string unit;
  std::string baseline_name;  // e.g. "memcpy, 1 thread"
  double baseline = 0;
  std::string baseline_unit;
  std::optional<double> ratio;  // value / baseline, or as the figure defines it
  std::string ratio_label;      // what the ratio is, e.g. "x memcpy"
  std::string target;           // e.g. "≥ 10x", empty when none
  std::optional<bool> met;      // nullopt when there is no target
  std::string note;             // how it was measured, one line
};

struct BenchReport {
  std::string machine;
  std::vector<std::pair<std::string, std::string>> config;  // printed and written as strings
  std::vector<Figure> figures;
  bool all_targets_met() const;
};

void PrintReport(const BenchReport& report);
Status WriteJson(const BenchReport& report, const std::string& path);

}  // namespace weightsync::bench
