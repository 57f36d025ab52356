// The helper programs' command loop (testing/command_loop.h): one answer a line, dispatch by verb,
// the shared verbs (arm, quit) and the protocol's error answers.
#include "testing/command_loop.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "util/fail_point.h"

namespace weightsync::testing {
namespace {

// Runs `loop` over `input`; returns what it answered and sets `*exit_code`.
std::string RunOver(CommandLoop& loop, const std::string& input, int* exit_code) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = ::open_memstream(&buffer, &size);
  std::istringstream in(input);
  *exit_code = loop.Run(in, out);
  std::fclose(out);
  std::string answers(buffer, size);
  std::free(buffer);
  return answers;
}

TEST(CommandLoop, AnswersEachLineByVerbAndEndsAtEndOfInput) {
  CommandLoop loop;
  loop.On("double", [](std::istream& args) {
    int n = 0;
    args >> n;
    return "ok " + std::to_string(2 * n);
  });
  int code = -1;
  EXPECT_EQ(RunOver(loop, "double 21\n\ndouble 5\nfrobnicate 1\n", &code),
            "ok 42\nok 10\nerror unknown command 'frobnicate'\n");
  EXPECT_EQ(code, 0);
}

TEST(CommandLoop, ArmSetsFailPointsAndRefusesABadSpec) {
  util::FailPoints::DisarmAll();
  CommandLoop loop;
  int code = -1;
  const std::string answers =
      RunOver(loop, "arm test.command_loop=error*1\narm test.command_loop=explode\n", &code);
  EXPECT_EQ(answers.substr(0, 3), "ok\n");
  EXPECT_EQ(answers.find("error invalid_argument: WEIGHTSYNC_FAILPOINTS: unknown action "
                         "'explode'"),
            3u)
      << answers;
  EXPECT_EQ(util::FailPoints::Check("test.command_loop").action, util::FailAction::kError);
  EXPECT_EQ(util::FailPoints::Hits("test.command_loop"), 1);
  util::FailPoints::DisarmAll();
}

TEST(CommandLoop, QuitAnswersTheCloseStatusAndItsExitCode) {
  CommandLoop ok_loop;
  bool closed = false;
  ok_loop.OnQuit([&] {
    closed = true;
    return Status::Ok();
  });
  int code = -1;
  EXPECT_EQ(RunOver(ok_loop, "quit\nnever read\n", &code), "ok\n");
  EXPECT_TRUE(closed);
  EXPECT_EQ(code, 0);

  CommandLoop failing;
  failing.OnQuit([] { return Status::IoError("close of the test object"); });
  EXPECT_EQ(RunOver(failing, "quit\n", &code), "io_error: close of the test object\n");
  EXPECT_EQ(code, 1);
}

TEST(CommandLoop, AnswerIsOkTextOrTheError) {
  EXPECT_EQ(Answer(Status::Ok(), "ok 3"), "ok 3");
  EXPECT_EQ(Answer(Status::PeerLost("gone"), "ok 3"), "error peer_lost: gone");
}

}  // namespace
}  // namespace weightsync::testing
