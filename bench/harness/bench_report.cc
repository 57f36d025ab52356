#include "harness/bench_report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace weightsync::bench {

bool BenchReport::all_targets_met() const {
  for (const auto& f : figures) {
    if (f.met.has_value() && !*f.met) return false;
  }
  return true;
}

namespace {

// Keys stay in the order written: the file's field order.
using Json = nlohmann::ordered_json;

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

// The file's numbers as they have always been written: six significant digits (printf %.6g),
// integral values without a fraction ("0", not "0.0"), null when not finite.
Json JsonNumber(double v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  const double rounded = std::strtod(buf, nullptr);
  if (std::trunc(rounded) == rounded && std::fabs(rounded) < 9e15) {
    return static_cast<int64_t>(rounded);
  }
  return rounded;
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
  Json config = Json::object();
  for (const auto& [key, value] : r.config) config[key] = value;
  Json figures = Json::array();
  for (const Figure& f : r.figures) {
    figures.push_back({
        {"id", f.id},
        {"name", f.name},
        {"value", JsonNumber(f.value)},
        {"unit", f.unit},
        {"baseline",
         {{"name", f.baseline_name}, {"value", JsonNumber(f.baseline)}, {"unit", f.baseline_unit}}},
        {"ratio", f.ratio ? JsonNumber(*f.ratio) : Json(nullptr)},
        {"ratio_label", f.ratio_label},
        {"target", f.target},
        {"met", f.met ? Json(*f.met) : Json(nullptr)},
        {"note", f.note},
    });
  }
  const Json report = {{"machine", r.machine},
                       {"config", std::move(config)},
                       {"figures", std::move(figures)},
                       {"all_targets_met", r.all_targets_met()}};
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::IoError("cannot write '", path, "'");
  // A byte that is not UTF-8 (a CPU name read from /proc) is replaced rather than thrown on.
  out << report.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  out.close();
  if (!out) return Status::IoError("writing '", path, "' failed");
  return Status::Ok();
}

}  // namespace weightsync::bench
