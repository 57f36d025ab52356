// Status assertions shared by every test: OK, code and message parts, assign-or-fail.
//   ASSERT_OK(sub->Sleep());
//   ASSERT_OK_AND_ASSIGN(auto stats, sub->Update());
//   ASSERT_STATUS_IS(kCorruption, stats, "tensor 'layers.", "nothing committed");
//   EXPECT_TRUE(testing::IsError(s, StatusCode::kProtocolError, {"magic", "0x57"}));
// An error must name the thing, the expected and the actual (STYLE.md §2): a test checks the
// message parts that say so, not only the code.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string_view>
#include <utility>

#include "weightsync/status.h"

#define ASSERT_OK(expr)                                        \
  do {                                                         \
    ::weightsync::Status ws_s_ = ::weightsync::ToStatus(expr); \
    ASSERT_TRUE(ws_s_.ok()) << ws_s_;                          \
  } while (0)
#define EXPECT_OK(expr)                                        \
  do {                                                         \
    ::weightsync::Status ws_s_ = ::weightsync::ToStatus(expr); \
    EXPECT_TRUE(ws_s_.ok()) << ws_s_;                          \
  } while (0)

// `ASSERT_OK_AND_ASSIGN(auto x, MakeX());` binds the value or fails the test with the status.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  WS_ASSERT_OK_AND_ASSIGN_IMPL_(WS_CONCAT_(ws_assign_, __LINE__), lhs, rexpr)
#define WS_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                  \
  ASSERT_TRUE(tmp.ok()) << tmp.status();               \
  lhs = std::move(tmp).value()

// The status of `expr` (a Status or a Result) has code StatusCode::`code_` and its message
// contains each of the optional parts.
#define ASSERT_STATUS_IS(code_, expr, ...)                                 \
  ASSERT_TRUE(::weightsync::testing::IsError(::weightsync::ToStatus(expr), \
                                             ::weightsync::StatusCode::code_, {__VA_ARGS__}))
#define EXPECT_STATUS_IS(code_, expr, ...)                                 \
  EXPECT_TRUE(::weightsync::testing::IsError(::weightsync::ToStatus(expr), \
                                             ::weightsync::StatusCode::code_, {__VA_ARGS__}))

namespace weightsync::testing {

// Success when `s` is an error with `code` whose message contains every part; the failure says
// which part is missing and shows the whole status.
::testing::AssertionResult IsError(const Status& s, StatusCode code,
                                   std::initializer_list<std::string_view> parts = {});

}  // namespace weightsync::testing
