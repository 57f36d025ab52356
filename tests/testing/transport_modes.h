// The ways a subscriber runs as one gtest parameter, for suites that must hold in every one of
// them: shm or tcp, staged or in place (TransportMode); staged or in place alone (UpdateMode).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "weightsync/options.h"

namespace weightsync::testing {

struct TransportMode {
  bool tcp;
  UpdateMode mode;
};

inline auto AllTransportModes() {
  return ::testing::Values(
      TransportMode{false, UpdateMode::kStaged}, TransportMode{false, UpdateMode::kInPlace},
      TransportMode{true, UpdateMode::kStaged}, TransportMode{true, UpdateMode::kInPlace});
}

// "shm_staged", "tcp_in_place", ...
inline std::string TransportModeName(const ::testing::TestParamInfo<TransportMode>& info) {
  return std::string(info.param.tcp ? "tcp" : "shm") +
         (info.param.mode == UpdateMode::kStaged ? "_staged" : "_in_place");
}

// Staged and in place: INSTANTIATE_TEST_SUITE_P(Modes, Suite, BothUpdateModes(), UpdateModeName).
inline auto BothUpdateModes() {
  return ::testing::Values(UpdateMode::kStaged, UpdateMode::kInPlace);
}

// "staged", "in_place"
inline std::string UpdateModeName(const ::testing::TestParamInfo<UpdateMode>& info) {
  return info.param == UpdateMode::kStaged ? "staged" : "in_place";
}

}  // namespace weightsync::testing
