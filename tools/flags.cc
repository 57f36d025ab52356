#include "flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "harness/byte_units.h"

namespace weightsync::tools {

FlagSet::FlagSet(std::string usage, std::string summary)
    : usage_(std::move(usage)), summary_(std::move(summary)) {}

void FlagSet::Add(Flag flag) { flags_.push_back(std::move(flag)); }

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

void FlagSet::String(const std::string& name, std::string* target, const std::string& help,
                     bool hidden) {
  Add({name, help, target->empty() ? "" : *target, false, hidden, false,
       [target](const std::string& v) {
         *target = v;
         return Status::Ok();
       }});
}

void FlagSet::Int(const std::string& name, int64_t* target, const std::string& help, bool hidden) {
  Add({name, help, std::to_string(*target), false, hidden, false,
       [name, target](const std::string& v) {
         errno = 0;
         char* end = nullptr;
         long long x = std::strtoll(v.c_str(), &end, 10);
         if (v.empty() || *end != '\0' || errno != 0) {
           return Status::InvalidArgument("--", name, "=", v, ": expected an integer");
         }
         *target = x;
         return Status::Ok();
       }});
}

void FlagSet::Double(const std::string& name, double* target, const std::string& help) {
  std::ostringstream def;
  def << *target;
  Add({name, help, def.str(), false, false, false, [name, target](const std::string& v) {
         char* end = nullptr;
         double x = std::strtod(v.c_str(), &end);
         if (v.empty() || *end != '\0' || !std::isfinite(x)) {
           return Status::InvalidArgument("--", name, "=", v, ": expected a number");
         }
         *target = x;
         return Status::Ok();
       }});
}

void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  Add({name, help, *target ? "true" : "false", true, false, false,
       [name, target](const std::string& v) {
         if (v == "true" || v == "1" || v == "yes") {
           *target = true;
         } else if (v == "false" || v == "0" || v == "no") {
           *target = false;
         } else {
           return Status::InvalidArgument("--", name, "=", v, ": expected true or false");
         }
         return Status::Ok();
       }});
}

void FlagSet::Bytes(const std::string& name, uint64_t* target, const std::string& help) {
  Add({name, help, bench::FormatBytes(*target), false, false, false,
       [name, target](const std::string& v) {
         Result<uint64_t> n = bench::ParseBytes(v);
         if (!n.ok()) return n.status().WithContext("--" + name);
         *target = *n;
         return Status::Ok();
       }});
}

Status FlagSet::Parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return Status::InvalidArgument("unexpected argument '", arg, "' (flags start with --)");
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return Status::InvalidArgument("unknown flag --", name, " (see --help)");
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return Status::InvalidArgument("--", name, " needs a value");
      }
    }
    WS_RETURN_IF_ERROR(flag->assign(value));
    flag->set = true;
  }
  return Status::Ok();
}

std::string FlagSet::Help() const {
  constexpr size_t kIndent = 26;
  constexpr size_t kColumns = 100;
  std::ostringstream os;
  os << "usage: " << usage_ << "\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& f : flags_) {
    if (f.hidden) continue;
    std::string head = "  --" + f.name + (f.is_bool ? "" : " VALUE");
    std::string line = head.size() < kIndent ? head + std::string(kIndent - head.size(), ' ')
                                             : head + "\n" + std::string(kIndent, ' ');
    // Description lines are given pre-broken; continuation lines stay aligned.
    std::string text = f.help;
    if (!f.default_text.empty()) {
      std::string def = "(default: " + f.default_text + ")";
      size_t last_line = text.rfind('\n');
      size_t last_len = text.size() - (last_line == std::string::npos ? 0 : last_line + 1);
      text += (kIndent + last_len + 1 + def.size() > kColumns ? "\n" : " ") + def;
    }
    for (char c : text) {
      line += c;
      if (c == '\n') line += std::string(kIndent, ' ');
    }
    os << line << "\n";
  }
  os << "  --help                  this text\n";
  return os.str();
}

}  // namespace weightsync::tools
