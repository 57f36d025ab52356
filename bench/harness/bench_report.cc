#include "harness/bench_report.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace weightsync::bench {

bool BenchReport::all_targets_met() const {
  for (const auto& f : figures) {
    if (f.met.has_value() && !*f.met) return false;
  }
  return true;
}

namespace {

std::string Number(double v) {
  char buf[32];
  double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 100) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else if (a >= 10) {
    std::snprintf(buf, sizeof(buf), "%.1f", v);
  } else if (a >= 0.01) {
    std::snprintf(buf, sizeof(buf), "%.2f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2g", v);
  }
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

void PrintReport(const BenchReport& r) {
  std::printf("weightsync bench: %s\n", r.machine.c_str());
  std::string config;
  for (const auto& [k, v] : r.config) config += (config.empty() ? "" : ", ") + k + " " + v;
  std::printf("  %s\n\n", config.c_str());
  std::printf("%-44s %16s  %-32s %12s  %-8s %s\n", "figure", "value", "baseline (same run)",
              "ratio", "target", "");
  for (const auto& f : r.figures) {
    std::string value = Number(f.value) + " " + f.unit;
    std::string baseline = f.baseline_name.empty()
                               ? ""
                               : f.baseline_name + " " + Number(f.baseline) + " " + f.baseline_unit;
    std::string ratio = f.ratio ? Number(*f.ratio) + f.ratio_label : "";
    std::string verdict = !f.met.has_value() ? "" : (*f.met ? "met" : "MISSED");
    std::printf("%-44s %16s  %-32s %12s  %-8s %s\n", f.name.c_str(), value.c_str(),
                baseline.c_str(), ratio.c_str(), f.target.c_str(), verdict.c_str());
  }
  std::printf("\nhow each figure is measured:\n");
  for (const auto& f : r.figures) {
    if (!f.note.empty()) std::printf("  %-42s %s\n", f.name.c_str(), f.note.c_str());
  }
  std::printf("\ntargets: %s\n", r.all_targets_met() ? "all met" : "SOME MISSED");
}

Status WriteJson(const BenchReport& r, const std::string& path) {
  std::ostringstream os;
  os << "{\n  \"machine\": " << JsonString(r.machine) << ",\n  \"config\": {";
  for (size_t i = 0; i < r.config.size(); ++i) {
    os << (i ? ", " : "") << JsonString(r.config[i].first) << ": "
       << JsonString(r.config[i].second);
  }
  os << "},\n  \"figures\": [\n";
  for (size_t i = 0; i < r.figures.size(); ++i) {
    const Figure& f = r.figures[i];
    os << "    {\"id\": " << JsonString(f.id) << ", \"name\": " << JsonString(f.name)
       << ", \"value\": " << JsonNumber(f.value) << ", \"unit\": " << JsonString(f.unit)
       << ",\n     \"baseline\": {\"name\": " << JsonString(f.baseline_name)
       << ", \"value\": " << JsonNumber(f.baseline) << ", \"unit\": " << JsonString(f.baseline_unit)
       << "}"
       << ", \"ratio\": " << (f.ratio ? JsonNumber(*f.ratio) : "null")
       << ", \"ratio_label\": " << JsonString(f.ratio_label)
       << ",\n     \"target\": " << JsonString(f.target)
       << ", \"met\": " << (!f.met ? "null" : (*f.met ? "true" : "false"))
       << ", \"note\": " << JsonString(f.note) << "}" << (i + 1 < r.figures.size() ? "," : "")
       << "\n";
  }
  os << "  ],\n  \"all_targets_met\": " << (r.all_targets_met() ? "true" : "false") << "\n}\n";
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::IoError("cannot write '", path, "'");
  out << os.str();
  out.close();
  if (!out) return Status::IoError("writing '", path, "' failed");
  return Status::Ok();
}

}  // namespace weightsync::bench
