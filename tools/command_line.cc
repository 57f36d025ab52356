#include "command_line.h"

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <vector>

#include "harness/byte_units.h"

namespace weightsync::tools {
namespace {

// --help as this CLI has always printed it: usage, summary, then one row per visible flag —
// the name (and VALUE unless it is a bool flag) in a 26-column field, the description as given
// (its lines pre-broken, continuation lines aligned) and "(default: X)" appended, on a line of
// its own when it would pass column 100; --help last.
class HelpFormatter : public CLI::FormatterBase {
 public:
  explicit HelpFormatter(std::string usage) : usage_(std::move(usage)) {}

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::ostringstream os;
    os << "usage: " << usage_ << "\n\n" << app->get_description() << "\n\nflags:\n";
    for (const CLI::Option* option : app->get_options()) {
      // CLI11 hides the options of the empty group.
      if (option == app->get_help_ptr() || option->get_group().empty()) continue;
      os << Row(*option);
    }
    os << Row(*app->get_help_ptr());
    return os.str();
  }

 private:
  static std::string Row(const CLI::Option& option) {
    constexpr size_t kIndent = 26;
    constexpr size_t kColumns = 100;
    const bool is_bool = option.get_expected_max() == 0;  // a flag: takes no value
    std::string head = "  --" + option.get_lnames().front() + (is_bool ? "" : " VALUE");
    std::string line = head.size() < kIndent ? head + std::string(kIndent - head.size(), ' ')
                                             : head + "\n" + std::string(kIndent, ' ');
    std::string text = option.get_description();
    if (const std::string& value = option.get_default_str(); !value.empty()) {
      std::string def = "(default: " + value + ")";
      size_t last_line = text.rfind('\n');
      size_t last_len = text.size() - (last_line == std::string::npos ? 0 : last_line + 1);
      text += (kIndent + last_len + 1 + def.size() > kColumns ? "\n" : " ") + def;
    }
    for (char c : text) {
      line += c;
      if (c == '\n') line += std::string(kIndent, ' ');
    }
    return line + "\n";
  }

  std::string usage_;
};

}  // namespace

CommandLine::CommandLine(std::string usage, std::string summary)
    : app_(std::move(summary), usage.substr(0, usage.find(" ["))) {
  app_.set_help_flag("--help,-h", "this text");
  app_.formatter(std::make_shared<HelpFormatter>(std::move(usage)));
  // As before CLI11: a flag given twice keeps its last value.
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

std::string CommandLine::Reject(std::string message) {
  if (first_error_.empty()) first_error_ = message;
  return message;
}

// The checks below are CLI11 transforms: they accept exactly what this CLI accepted before and
// hand CLI11 a canonical text (CLI11 alone would also read "0x10" or "010" as integers, in base
// 16 and 8, and "on" or "2" as true).

CLI::Option* CommandLine::String(const std::string& name, std::string* target,
                                 const std::string& help) {
  return app_.add_option("--" + name, *target, help)->default_str(*target);
}

CLI::Option* CommandLine::Int(const std::string& name, int64_t* target, const std::string& help) {
  return app_.add_option("--" + name, *target, help)
      ->default_str(std::to_string(*target))
      ->transform(CLI::Validator(
          [this, name](std::string& v) {
            errno = 0;
            char* end = nullptr;
            long long x = std::strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || errno != 0) {
              return Reject("--" + name + "=" + v + ": expected an integer");
            }
            v = std::to_string(x);
            return std::string();
          },
          ""));
}

CLI::Option* CommandLine::Bool(const std::string& name, bool* target, const std::string& help) {
  return app_.add_flag("--" + name, *target, help)
      ->default_str(*target ? "true" : "false")
      ->transform(CLI::Validator(
          [this, name](std::string& v) {
            if (v == "true" || v == "1" || v == "yes") {
              v = "true";
            } else if (v == "false" || v == "0" || v == "no") {
              v = "false";
            } else {
              return Reject("--" + name + "=" + v + ": expected true or false");
            }
            return std::string();
          },
          ""));
}

CLI::Option* CommandLine::Bytes(const std::string& name, uint64_t* target,
                                const std::string& help) {
  return app_.add_option("--" + name, *target, help)
      ->default_str(bench::FormatBytes(*target))
      ->transform(CLI::Validator(
          [this, name](std::string& v) {
            Result<uint64_t> n = bench::ParseBytes(v);
            if (!n.ok()) return Reject(n.status().WithContext("--" + name).message());
            v = std::to_string(*n);
            return std::string();
          },
          ""));
}

Status CommandLine::Parse(int argc, char** argv) {
  // CLI11 wants the arguments in reverse order. It reads "--name=" as "--name" followed by the
  // next argument; here it is an empty value, as it always was ("--json=" skips the JSON).
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 0; --i) {
    std::string arg = argv[i];
    const CLI::Option* option = arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '='
                                    ? app_.get_option_no_throw(arg.substr(0, arg.size() - 1))
                                    : nullptr;
    if (arg == "--") Reject("unknown flag -- (see --help)");  // CLI11: "only positionals follow"
    if (option == nullptr) {
      args.push_back(std::move(arg));
    } else if (option->get_expected_max() == 0) {  // a bool flag: CLI11 would read it as bare
      Reject(arg + ": expected true or false");
      args.push_back(std::move(arg));
    } else {
      args.push_back("");
      args.push_back(arg.substr(0, arg.size() - 1));
    }
  }
  const std::string last = argc > 0 ? argv[argc - 1] : "";
  std::string error;
  try {
    app_.parse(args);
  } catch (const CLI::CallForHelp&) {
  } catch (const CLI::ExtrasError&) {
    // The first argument no flag took: "--stpes=3" names the flag "--stpes".
    const std::string first = app_.remaining().front();
    error = first.rfind("--", 0) == 0
                ? "unknown flag " + first.substr(0, first.find('=')) + " (see --help)"
                : "unexpected argument '" + first + "' (flags start with --)";
  } catch (const CLI::ArgumentMismatch& e) {
    // Only a value-taking flag at the very end can miss its value.
    error = last.rfind("--", 0) == 0 ? last + " needs a value" : e.what();
  } catch (const CLI::ParseError& e) {
    error = e.what();
  }
  if (app_.get_help_ptr()->count() > 0) {
    help_requested_ = true;
    return Status::Ok();
  }
  if (!first_error_.empty()) return Status::InvalidArgument(first_error_);
  if (!error.empty()) return Status::InvalidArgument(error);
  return Status::Ok();
}

}  // namespace weightsync::tools
