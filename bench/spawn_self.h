// SpawnSelf: runs this benchmark's own program again (/proc/self/exe) as a child with `args`, its
// stdin and stdout pipes to this process: how the GPU benchmarks put a publisher (or a memory
// owner) in a second process, the way trainer and engine are two processes. A benchmark cannot
// go on without its child, so a failure to start one exits the program.
#pragma once

#include <spawn.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;  // the child gets this process's environment

namespace weightsync::bench {

struct SelfChild {
  pid_t pid = -1;
  FILE* in = nullptr;   // the child's stdin (closing it tells the child to end)
  FILE* out = nullptr;  // the child's stdout
};

inline SelfChild SpawnSelf(std::vector<std::string> args) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) std::exit(1);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  posix_spawn_file_actions_addclose(&fa, to[1]);
  posix_spawn_file_actions_addclose(&fa, from[0]);
  args.insert(args.begin(), "/proc/self/exe");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  SelfChild c;
  if (posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot start a child of this benchmark\n");
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  c.in = fdopen(to[1], "w");
  c.out = fdopen(from[0], "r");
  return c;
}

}  // namespace weightsync::bench
