// Knobs are declared once (src/util/knobs.cc): every enumerator has exactly one row, names are
// WEIGHTSYNC_*, docs/env_vars.md documents each, and the typed getter turns a bad value into an
// error that names the variable and the value.
#include "util/knobs.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "testing/status_matchers.h"

namespace weightsync::util {
namespace {

TEST(Knobs, EveryKnobIsDeclaredOnceWithAWeightsyncName) {
  std::set<std::string> names;
  std::set<int> knobs;
  for (const KnobInfo& k : AllKnobs()) {
    EXPECT_EQ(std::string(k.name).rfind("WEIGHTSYNC_", 0), 0u) << k.name;
    EXPECT_TRUE(names.insert(std::string(k.name)).second) << "declared twice: " << k.name;
    EXPECT_TRUE(knobs.insert(static_cast<int>(k.knob)).second) << k.name;
    EXPECT_FALSE(k.meaning.empty()) << k.name;
    EXPECT_FALSE(k.type.empty()) << k.name;
    EXPECT_EQ(Describe(k.knob).name, k.name);
  }
  EXPECT_EQ(knobs.size(), static_cast<size_t>(Knob::kCount)) << "an enumerator has no row";
}

TEST(Knobs, DocsListEveryKnob) {
  std::ifstream in(std::string(WS_SOURCE_DIR) + "/docs/env_vars.md");
  ASSERT_TRUE(in) << "docs/env_vars.md not found under " << WS_SOURCE_DIR;
  std::stringstream text;
  text << in.rdbuf();
  for (const KnobInfo& k : AllKnobs()) {
    EXPECT_NE(text.str().find("`" + std::string(k.name) + "`"), std::string::npos)
        << k.name << " is not documented in docs/env_vars.md";
  }
}

TEST(Knobs, UnsetAndEmptyMeanDefaultAndABadValueIsNamed) {
  ::unsetenv("WEIGHTSYNC_LOG_LEVEL");
  EXPECT_FALSE(KnobValue(Knob::kLogLevel).has_value());
  ASSERT_TRUE(LogLevelKnob().ok());
  EXPECT_EQ(*LogLevelKnob(), KnobLogLevel::kInfo);
  ::setenv("WEIGHTSYNC_LOG_LEVEL", "", 1);
  EXPECT_FALSE(KnobValue(Knob::kLogLevel).has_value());
  ::setenv("WEIGHTSYNC_LOG_LEVEL", "WARN", 1);
  ASSERT_TRUE(LogLevelKnob().ok());
  EXPECT_EQ(*LogLevelKnob(), KnobLogLevel::kWarn);
  ::setenv("WEIGHTSYNC_LOG_LEVEL", "loud", 1);
  Result<KnobLogLevel> bad = LogLevelKnob();
  EXPECT_STATUS_IS(kInvalidArgument, bad, "WEIGHTSYNC_LOG_LEVEL='loud'");
  ::unsetenv("WEIGHTSYNC_LOG_LEVEL");
  ::setenv("WEIGHTSYNC_NCCL_LIBRARY", "/opt/nccl/libnccl.so", 1);
  EXPECT_EQ(KnobValue(Knob::kNcclLibrary).value_or(""), "/opt/nccl/libnccl.so");
  ::unsetenv("WEIGHTSYNC_NCCL_LIBRARY");
}

}  // namespace
}  // namespace weightsync::util
