// Command-line flags for the CLI. Each flag is declared once (name, target, default taken from the
// target's value at declaration, description); --help text is generated from the declarations.
// Accepts "--name value" and "--name=value"; a bool flag also accepts a bare "--name".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weightsync/status.h"

namespace weightsync::tools {

class FlagSet {
 public:
  // `usage` is the first help line, e.g. "weightsync demo [flags]"; `summary` what it does.
  FlagSet(std::string usage, std::string summary);

  // Hidden flags are accepted but left out of --help (used between the demo's processes).
  void String(const std::string& name, std::string* target, const std::string& help,
              bool hidden = false);
  void Int(const std::string& name, int64_t* target, const std::string& help, bool hidden = false);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  // A byte count: plain number or with a suffix K, M, G (powers of 1024, "KiB"/"KB" also accepted).
  void Bytes(const std::string& name, uint64_t* target, const std::string& help);

  // Parses argv[0..argc). Errors name the flag and the value. Sets help_requested() on --help/-h.
  Status Parse(int argc, char** argv);
  bool help_requested() const { return help_requested_; }
  bool WasSet(const std::string& name) const;
  std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    bool hidden = false;
    bool set = false;
    std::function<Status(const std::string&)> assign;
  };
  void Add(Flag flag);
  Flag* Find(const std::string& name);

  std::string usage_;
  std::string summary_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

}  // namespace weightsync::tools
