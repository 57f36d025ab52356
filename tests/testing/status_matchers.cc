#include "testing/status_matchers.h"

#include <string>

namespace weightsync::testing {

::testing::AssertionResult IsError(const Status& s, StatusCode code,
                                   std::initializer_list<std::string_view> parts) {
  if (s.ok()) {
    return ::testing::AssertionFailure() << "expected " << StatusCodeName(code) << ", got OK";
  }
  if (s.code() != code) {
    return ::testing::AssertionFailure()
           << "expected code " << StatusCodeName(code) << ", got " << s.ToString();
  }
  for (std::string_view part : parts) {
    if (s.message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << part << "': " << s.ToString();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace weightsync::testing
