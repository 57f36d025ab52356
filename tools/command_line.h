// A subcommand's flags, parsed by CLI11 (Debian libcli11-dev). Each flag is declared once (name,
// target, description; the default shown in --help is the target's value at declaration).
// Accepts "--name value" and "--name=value"; a bool flag also accepts a bare "--name"; a flag
// given twice keeps its last value. What CLI11 does not decide the way this CLI always has is
// fixed here, in one place: the --help layout (HelpFormatter in command_line.cc), the values each
// kind of flag accepts, "--name=" meaning an empty value, and error texts that name the flag and
// the value.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "weightsync/status.h"

namespace weightsync::tools {

class CommandLine {
 public:
  // `usage` is the first help line, e.g. "weightsync demo [flags]"; `summary` what it does.
  CommandLine(std::string usage, std::string summary);
  CommandLine(const CommandLine&) = delete;  // the flags' checks point at this object
  CommandLine& operator=(const CommandLine&) = delete;

  // Each returns the CLI11 option; `->group("")` hides it from --help (the flags the demo passes
  // between its processes) while it stays accepted.
  CLI::Option* String(const std::string& name, std::string* target, const std::string& help);
  CLI::Option* Int(const std::string& name, int64_t* target, const std::string& help);
  CLI::Option* Bool(const std::string& name, bool* target, const std::string& help);
  // A byte count: plain number or with a suffix K, M, G (bench::ParseBytes).
  CLI::Option* Bytes(const std::string& name, uint64_t* target, const std::string& help);

  // Parses argv[0..argc). Errors are InvalidArgument naming the flag and the value. --help or -h
  // anywhere sets help_requested() (and wins over any error).
  Status Parse(int argc, char** argv);
  bool help_requested() const { return help_requested_; }
  bool WasSet(const std::string& name) const { return app_.count("--" + name) > 0; }
  std::string Help() const { return app_.help(); }

 private:
  // A check that records `message` (the first one only: CLI11 stops at the first failing flag).
  std::string Reject(std::string message);

  CLI::App app_;
  std::string first_error_;
  bool help_requested_ = false;
};

}  // namespace weightsync::tools
