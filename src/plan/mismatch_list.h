// MismatchList: collects every problem found while matching manifests so that one error lists
// them all (one per line), keeping the first kMaxListedMismatches and counting the rest.
#pragma once

#include <cstddef>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "weightsync/status.h"

namespace weightsync::plan {

// Lines listed in one error; a wholly different pair of models would otherwise produce a message
// of thousands of lines that nobody reads.
inline constexpr size_t kMaxListedMismatches = 100;

class MismatchList {
 public:
  // `between` completes "plan: N mismatches between ...".
  explicit MismatchList(std::string between) : between_(std::move(between)) {}

  template <typename... Args>
  void Add(Args&&... args) {
    ++count_;
    if (count_ > kMaxListedMismatches) return;
    std::ostringstream line;
    (line << ... << args);
    lines_.push_back(line.str());
  }

  bool empty() const { return count_ == 0; }

  Status ToStatus() const {
    std::ostringstream os;
    os << "plan: " << count_ << (count_ == 1 ? " mismatch" : " mismatches") << " between "
       << between_ << ":";
    for (const std::string& line : lines_) os << "\n  " << line;
    if (count_ > lines_.size()) os << "\n  ... and " << (count_ - lines_.size()) << " more";
    return Status::InvalidArgument(os.str());
  }

 private:
  std::string between_;
  size_t count_ = 0;
  std::vector<std::string> lines_;
};

}  // namespace weightsync::plan
