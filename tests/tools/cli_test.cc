// The weightsync CLI end to end: `demo` runs two real processes over shared memory and exits 0
// only if every step verified; `bench --quick` prints its table, writes JSON and measures zero
// heap allocations per steady-state step.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "weightsync/cuda.h"

namespace weightsync {
namespace {

namespace fs = std::filesystem;

// build/tests/tools_cli_test → build/weightsync
std::string CliPath() {
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "weightsync").string();
}

struct CliRun {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr
};

CliRun RunCli(const std::string& args, const std::string& env = "") {
  std::string command = env + (env.empty() ? "" : " ") + CliPath() + " " + args + " 2>&1";
  CliRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  int status = ::pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

bool Has(const CliRun& run, const std::string& needle) {
  return run.output.find(needle) != std::string::npos;
}

using Json = nlohmann::ordered_json;  // keeps the file's key order

// The keys of a JSON object, in the file's order.
std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& item : object.items()) keys.push_back(item.key());
  return keys;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(CliPath()))
        << CliPath() << " is missing: build the weightsync_cli target before this test";
  }
};

TEST_F(CliTest, InfoListsEveryKnobAndNeverPrintsTheToken) {
  CliRun info =
      RunCli("info", "WEIGHTSYNC_TOKEN=do-not-print-this-secret WEIGHTSYNC_SOCKET_DIR=/tmp/x");
  EXPECT_EQ(info.exit_code, 0) << info.output;
  for (const char* knob :
       {"WEIGHTSYNC_LOG_LEVEL", "WEIGHTSYNC_SOCKET_DIR", "WEIGHTSYNC_TOKEN_FILE",
        "WEIGHTSYNC_TOKEN", "WEIGHTSYNC_NCCL_LIBRARY", "WEIGHTSYNC_FAILPOINTS"}) {
    EXPECT_TRUE(Has(info, knob)) << knob << " missing from:\n" << info.output;
  }
  EXPECT_FALSE(Has(info, "do-not-print-this-secret")) << info.output;
  EXPECT_TRUE(Has(info, "set (hidden)")) << info.output;
  EXPECT_TRUE(Has(info, "now '/tmp/x'")) << info.output;
  EXPECT_TRUE(Has(info, "shm       local://NAME   available")) << info.output;
  // Both tables: the subscriber's data paths and the publisher's stores.
  for (const char* row : {"  shm-ring ", "  nccl-zero-copy ", "  host-arena ", "  zero-copy "}) {
    EXPECT_TRUE(Has(info, row)) << row << " missing from:\n" << info.output;
  }
  // Where deltas go, and the rule that picks them.
  EXPECT_TRUE(Has(info, "deltas (docs/deltas.md): over tcp")) << info.output;
  EXPECT_TRUE(Has(info, "at most 1/4 of it")) << info.output;
  // And the formats a subscriber converts into.
  EXPECT_TRUE(Has(info, "-> MXFP8 (e8m0 per 32) and NVFP4 (e4m3 per 16")) << info.output;
  // A knob set to a value it cannot take is named, with the value, and fails the command.
  CliRun bad = RunCli("info", "WEIGHTSYNC_LOG_LEVEL=loud");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(Has(bad, "WEIGHTSYNC_LOG_LEVEL='loud' is not one of debug, info, warn, error"))
      << bad.output;
}

TEST_F(CliTest, InfoPrintsThePathTableInOrder) {
  CliRun info = RunCli("info");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  const size_t begin =
      info.output.find("data paths (first that serves a link, store and destinations wins):\n");
  ASSERT_NE(begin, std::string::npos) << info.output;
  const size_t end = info.output.find("environment knobs", begin);
  ASSERT_NE(end, std::string::npos) << info.output;
  const std::string table = info.output.substr(begin, end - begin);
  // One row per path, name first, in the table's order of preference, each saying what it moves.
  size_t at = 0;
  for (const char* name : {"shm", "host-to-gpu", "gpu-to-host", "cuda-ipc", "tcp", "nccl"}) {
    const size_t row = table.find("\n  " + std::string(name) + " ", at);
    ASSERT_NE(row, std::string::npos) << name << " missing (or out of order) in:\n" << table;
    const std::string line = table.substr(row + 1, table.find('\n', row + 1) - row - 1);
    EXPECT_NE(line.find(" -> "), std::string::npos) << "no 'store -> destination' in: " << line;
    at = row + 1;
  }
}

TEST_F(CliTest, HelpListsCommandsAndFlags) {
  CliRun top = RunCli("--help");
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_TRUE(Has(top, "demo")) << top.output;
  EXPECT_TRUE(Has(top, "bench")) << top.output;

  CliRun demo = RunCli("demo --help");
  EXPECT_EQ(demo.exit_code, 0) << demo.output;
  for (const char* flag : {"--model", "--scale", "--steps", "--dtype", "--mode", "--verify",
                           "--progress", "--endpoint"}) {
    EXPECT_TRUE(Has(demo, flag)) << flag << " missing from:\n" << demo.output;
  }
  EXPECT_FALSE(Has(demo, "--role")) << "internal flags stay out of --help";

  CliRun bench = RunCli("bench --help");
  EXPECT_EQ(bench.exit_code, 0) << bench.output;
  for (const char* flag : {"--quick", "--bytes", "--json", "--check", "--rss-steps"}) {
    EXPECT_TRUE(Has(bench, flag)) << flag << " missing from:\n" << bench.output;
  }
}

TEST_F(CliTest, BadInvocationsExit2AndNameTheProblem) {
  CliRun unknown = RunCli("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_TRUE(Has(unknown, "unknown command 'frobnicate'")) << unknown.output;

  CliRun flag = RunCli("demo --stpes 3");
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_TRUE(Has(flag, "unknown flag --stpes")) << flag.output;

  CliRun model = RunCli("demo --model gpt-17");
  EXPECT_EQ(model.exit_code, 2);
  EXPECT_TRUE(Has(model, "unknown model 'gpt-17'")) << model.output;
}

TEST_F(CliTest, DemoRunsTwoProcessesAndVerifiesEveryStep) {
  CliRun run = RunCli("demo --steps 3 --scale 0.001 --progress never");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* line : {"model   qwen2.5-0.5b", "   1/3", "   2/3", "   3/3", "created",
                           "reused", "summary:", "first update (prepares the handle)",
                           "steady-state update, median", "heap allocations per steady step",
                           "subscriber RSS", "verified", "3/3 steps", "demo: PASS"}) {
    EXPECT_TRUE(Has(run, line)) << "'" << line << "' missing from:\n" << run.output;
  }
  EXPECT_TRUE(Has(run, "subscriber Update 0 (max 0), publisher Publish 0 (max 0)")) << run.output;
  EXPECT_TRUE(Has(run, "path shm")) << run.output;
}

TEST_F(CliTest, DemoDeviceFlagsAreChecked) {
  CliRun bad = RunCli("demo --device gpu");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(Has(bad, "--device=gpu: expected cpu, cuda or cuda:N")) << bad.output;
  CliRun side = RunCli("demo --subscriber-device cuda:x");
  EXPECT_EQ(side.exit_code, 2) << side.output;
  EXPECT_TRUE(Has(side, "--subscriber-device=cuda:x")) << side.output;
}

// Every side on a GPU, each on its own, and both: the path table picks a different data path for
// each, and every step is checked against its expected digest after copying it back. Without a
// usable GPU the demo refuses up front, saying why.
TEST_F(CliTest, DemoOnTheGpu) {
  const Status cuda = CudaStatus();
  const std::string common = "demo --steps 3 --scale 0.001 --progress never ";
  if (!cuda.ok()) {
    CliRun run = RunCli(common + "--device cuda");
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_TRUE(Has(run, cuda.message())) << run.output;
    EXPECT_FALSE(Has(run, "demo: PASS")) << run.output;
    return;
  }
  for (const auto& [flags, path] : std::vector<std::pair<std::string, std::string>>{
           {"--device cuda", "cuda-ipc"},
           {"--device cuda:0 --mode in_place", "cuda-ipc"},
           {"--subscriber-device cuda", "host-to-gpu"},
           {"--publisher-device cuda", "gpu-to-host"}}) {
    CliRun run = RunCli(common + flags);
    EXPECT_EQ(run.exit_code, 0) << flags << "\n" << run.output;
    EXPECT_TRUE(Has(run, "path " + path)) << flags << "\n" << run.output;
    EXPECT_TRUE(Has(run, "3/3 steps")) << flags << "\n" << run.output;
  }
}

TEST_F(CliTest, DemoOtherPresetsBuild) {
  for (const char* model : {"qwen2.5-7b", "llama3-8b"}) {
    CliRun run =
        RunCli(std::string("demo --steps 2 --scale 0.0005 --progress never --model ") + model);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_TRUE(Has(run, "demo: PASS")) << run.output;
  }
}

// A bit flipped after the copy must fail the run: through the publisher's digests when verify is
// on, and through the demo's own expected digests when it is off.
TEST_F(CliTest, DemoFailsWhenReceivedBytesAreCorrupt) {
  const std::string flip = "WEIGHTSYNC_FAILPOINTS='subscriber.flip_received=flip*1'";
  CliRun verified = RunCli("demo --steps 3 --scale 0.001 --progress never", flip);
  EXPECT_EQ(verified.exit_code, 1) << verified.output;
  EXPECT_TRUE(Has(verified, "corruption")) << verified.output;
  EXPECT_TRUE(Has(verified, "demo: FAILED")) << verified.output;

  CliRun unverified = RunCli("demo --steps 3 --scale 0.001 --progress never --verify=false", flip);
  EXPECT_EQ(unverified.exit_code, 1) << unverified.output;
  EXPECT_TRUE(Has(unverified, "differ from the expected bytes")) << unverified.output;
  EXPECT_TRUE(Has(unverified, "demo: FAILED")) << unverified.output;
}

TEST_F(CliTest, BenchQuickPrintsTableWritesJsonAndAllocatesNothingPerStep) {
  std::string dir = ::testing::TempDir() + "cli_test_" + std::to_string(::getpid());
  fs::create_directories(dir);
  std::string json_path = dir + "/bench.json";
  CliRun run = RunCli("bench --quick --json " + json_path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* line :
       {"shm update, staged", "memcpy 1 thread", "first update (prepare)", "steady-state step",
        "overhead beyond the copy", "fresh Subscriber every step", "heap allocs per step: Publish",
        "heap allocs per step: Update", "heap allocs per step: whole process", "RSS slope",
        "wrote "}) {
    EXPECT_TRUE(Has(run, line)) << "'" << line << "' missing from:\n" << run.output;
  }
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << json_path;
  const Json report = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << json_path << " is not JSON";
  // The fields readers of the file rely on, in their order.
  EXPECT_EQ(Keys(report),
            (std::vector<std::string>{"machine", "config", "figures", "all_targets_met"}));
  ASSERT_TRUE(report["figures"].is_array());
  std::map<std::string, Json> figures;
  for (const Json& figure : report["figures"]) {
    EXPECT_EQ(Keys(figure),
              (std::vector<std::string>{"id", "name", "value", "unit", "baseline", "ratio",
                                        "ratio_label", "target", "met", "note"}))
        << figure.dump();
    EXPECT_EQ(Keys(figure["baseline"]), (std::vector<std::string>{"name", "value", "unit"}));
    figures[figure["id"].get<std::string>()] = figure;
  }
  // Allocation counts are exact, not timings: zero per steady-state step is asserted.
  for (const char* id : {"allocs_publish", "allocs_update", "allocs_process"}) {
    ASSERT_TRUE(figures.count(id)) << id << " missing from:\n" << report.dump(2);
    EXPECT_EQ(figures[id]["value"], 0) << figures[id].dump();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace weightsync
