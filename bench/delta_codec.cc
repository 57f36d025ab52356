// The segment delta (src/delta/segment_delta.h) against the alternatives and a memcpy, in one
// run: how many bytes each encoding of the same change takes, and what encoding and applying it
// cost next to copying the whole segment.
//
//   ws_delta_codec synthetic [--mib 64] [--fractions 0,0.001,0.014,0.03,0.087,0.4,1]
//   ws_delta_codec files BASE NEXT SEGMENTS    (SEGMENTS: one segment size in bytes per line)
//   common: [--element-bytes 2] [--segment-mib 8] [--repeat 5] [--json] [--words]
//
// synthetic: bf16 elements, each nudged by one unit in the last place with probability f (the
// way a small AdamW step moves a bf16 value), cut into segments of --segment-mib. files: two
// versions of a model as raw bytes (bench/delta_training.py writes them) and its tensor sizes.
//
// Rows: changed %, the segment delta's bytes (segments whose delta would not be smaller go
// whole), what a bitmap + values and a LEB128 gap list + values would take, and the median
// encode and apply times as multiples of a memcpy of the whole version (same run). Every apply
// is checked bit for bit against the new version.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "delta/segment_delta.h"

namespace {

namespace delta = weightsync::delta;
using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string mode;
  std::string base_path, next_path, segments_path;
  double mib = 64;
  double segment_mib = 8;
  std::vector<double> fractions = {0, 0.001, 0.014, 0.03, 0.087, 0.4, 1};
  uint32_t element_bytes = 2;
  int repeat = 5;
  bool json = false;
  bool words = false;  // the comparison kernel of CPUs without SSE2
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(
      stderr,
      "ws_delta_codec: %s\nusage: ws_delta_codec synthetic [--mib M] [--fractions a,b]\n"
      "       ws_delta_codec files BASE NEXT SEGMENTS\n"
      "       common: [--element-bytes E] [--segment-mib M] [--repeat N] [--json] [--words]\n",
      why);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--mib") {
      o.mib = std::stod(value());
    } else if (a == "--segment-mib") {
      o.segment_mib = std::stod(value());
    } else if (a == "--element-bytes") {
      o.element_bytes = static_cast<uint32_t>(std::stoul(value()));
    } else if (a == "--repeat") {
      o.repeat = std::max(1, std::stoi(value()));
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--words") {
      o.words = true;
    } else if (a == "--fractions") {
      o.fractions.clear();
      const std::string list = value();
      for (size_t at = 0; at < list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        o.fractions.push_back(std::stod(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (!a.empty() && a[0] == '-') {
      Usage(("unknown option " + a).c_str());
    } else {
      positional.push_back(a);
    }
  }
  if (positional.empty()) Usage("no mode");
  o.mode = positional[0];
  if (o.mode == "files") {
    if (positional.size() != 4) Usage("files needs BASE NEXT SEGMENTS");
    o.base_path = positional[1];
    o.next_path = positional[2];
    o.segments_path = positional[3];
  } else if (o.mode != "synthetic" || positional.size() != 1) {
    Usage("the mode is synthetic or files");
  }
  return o;
}

Bytes ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Usage(("cannot read " + path).c_str());
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

template <typename F>
double MedianSeconds(int repeat, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < repeat; ++r) {
    const auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

uint64_t Leb128Bytes(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}

struct Row {
  double fraction = 0;  // asked (synthetic) or -1
  uint32_t element_bytes = 2;
  uint64_t version_bytes = 0, changed = 0, delta_bytes = 0, segments = 0, sent_whole = 0;
  uint64_t bitmap_bytes = 0, gap_list_bytes = 0;
  double encode_s = 0, apply_s = 0, memcpy_s = 0;
};

// Encodes every segment of `next` against `base` (whole where the delta would not be smaller),
// applies the deltas to a copy of `base` and checks it equals `next`; times all three.
Row Measure(const Bytes& base, const Bytes& next, const std::vector<uint64_t>& segments, uint32_t e,
            int repeat, delta::MaskKernel kernel) {
  Row row;
  row.element_bytes = e;
  row.version_bytes = next.size();
  row.segments = segments.size();
  for (uint64_t at = 0, s = 0; s < segments.size(); at += segments[s++]) {
    uint64_t previous = 0;
    for (uint64_t i = 0; i < segments[s] / e; ++i) {
      if (std::memcmp(&base[at + i * e], &next[at + i * e], e) == 0) continue;
      ++row.changed;
      row.gap_list_bytes += Leb128Bytes(i - previous) + e;
      previous = i;
    }
    row.bitmap_bytes += (segments[s] / e + 7) / 8;
  }
  row.bitmap_bytes += row.changed * e;

  Bytes wire(next.size());  // every segment's delta (or itself), back to back
  std::vector<uint64_t> encoded(segments.size());  // 0: sent whole
  delta::SegmentEncoder encoder(kernel);
  auto encode = [&] {
    for (uint64_t at = 0, s = 0; s < segments.size(); at += segments[s++]) {
      const auto d = encoder.Encode(std::span(base).subspan(at, segments[s]),
                                    std::span(next).subspan(at, segments[s]), e,
                                    std::span(wire).subspan(at, segments[s]));
      if (d) {
        encoded[s] = d->bytes;
      } else {
        encoded[s] = 0;
        std::memcpy(&wire[at], &next[at], segments[s]);
      }
    }
  };
  row.encode_s = MedianSeconds(repeat, encode);
  for (size_t s = 0; s < segments.size(); ++s) {
    row.delta_bytes += encoded[s] != 0 ? encoded[s] : segments[s];
    row.sent_whole += encoded[s] == 0;
  }
  Bytes applied = base;
  auto apply = [&] {
    for (uint64_t at = 0, s = 0; s < segments.size(); at += segments[s++]) {
      auto into = std::span(applied).subspan(at, segments[s]);
      if (encoded[s] == 0) {
        std::memcpy(into.data(), &wire[at], segments[s]);
        continue;
      }
      const auto st = delta::ApplyDelta(std::span(wire).subspan(at, encoded[s]), e, into);
      if (!st.ok()) {
        std::fprintf(stderr, "ws_delta_codec: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    }
  };
  row.apply_s = MedianSeconds(repeat, apply);
  if (applied != next) {
    std::fprintf(stderr, "ws_delta_codec: the applied deltas do not give the new version\n");
    std::exit(1);
  }
  Bytes copy(next.size());
  row.memcpy_s = MedianSeconds(repeat, [&] { std::memcpy(copy.data(), next.data(), next.size()); });
  return row;
}

void Print(const Row& r, bool json, bool header) {
  const double full = static_cast<double>(r.version_bytes);
  const double changed_bytes = static_cast<double>(r.changed) * r.element_bytes;
  if (json) {
    std::printf(
        "{\"fraction\": %.6f, \"version_bytes\": %llu, \"changed_elements\": %llu, "
        "\"delta_bytes\": %llu, \"segments\": %llu, \"sent_whole\": %llu, \"bitmap_bytes\": %llu, "
        "\"gap_list_bytes\": %llu, \"encode_s\": %.6f, \"apply_s\": %.6f, \"memcpy_s\": %.6f}\n",
        r.fraction, static_cast<unsigned long long>(r.version_bytes),
        static_cast<unsigned long long>(r.changed), static_cast<unsigned long long>(r.delta_bytes),
        static_cast<unsigned long long>(r.segments), static_cast<unsigned long long>(r.sent_whole),
        static_cast<unsigned long long>(r.bitmap_bytes),
        static_cast<unsigned long long>(r.gap_list_bytes), r.encode_s, r.apply_s, r.memcpy_s);
    return;
  }
  if (header) {
    std::printf("%9s %9s %9s %10s %9s %9s %11s %10s %9s\n", "changed", "delta/v", "delta/chg",
                "whole segs", "bitmap/v", "gaps/v", "encode/cpy", "apply/cpy", "memcpy");
  }
  std::printf("%8.3f%% %8.2f%% %9.2f %5llu/%-4llu %8.2f%% %8.2f%% %10.2fx %9.2fx %7.1fms\n",
              100.0 * changed_bytes / full, 100.0 * r.delta_bytes / full,
              changed_bytes > 0 ? r.delta_bytes / changed_bytes : 0.0,
              static_cast<unsigned long long>(r.sent_whole),
              static_cast<unsigned long long>(r.segments), 100.0 * r.bitmap_bytes / full,
              100.0 * r.gap_list_bytes / full, r.encode_s / r.memcpy_s, r.apply_s / r.memcpy_s,
              1e3 * r.memcpy_s);
}

delta::MaskKernel Kernel(const Options& o) {
  return o.words ? delta::MaskKernel::kWords : delta::MaskKernel::kVector;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  if (o.mode == "files") {
    const Bytes base = ReadFile(o.base_path);
    const Bytes next = ReadFile(o.next_path);
    std::vector<uint64_t> segments;
    std::ifstream f(o.segments_path);
    uint64_t total = 0;
    for (uint64_t n; f >> n; total += n) segments.push_back(n);
    if (base.size() != next.size() || total != next.size()) {
      Usage("BASE, NEXT and the sum of SEGMENTS must be the same size");
    }
    Row row = Measure(base, next, segments, o.element_bytes, o.repeat, Kernel(o));
    row.fraction = -1;
    Print(row, o.json, true);
    return 0;
  }
  const auto bytes = static_cast<uint64_t>(o.mib * (1 << 20)) / 2 * 2;
  const auto segment = std::max<uint64_t>(2, static_cast<uint64_t>(o.segment_mib * (1 << 20)));
  std::vector<uint64_t> segments;
  for (uint64_t at = 0; at < bytes; at += segment)
    segments.push_back(std::min(segment, bytes - at));
  std::mt19937_64 rng(1);
  Bytes base(bytes);
  for (auto& b : base) b = static_cast<uint8_t>(rng());
  bool header = true;
  for (const double fraction : o.fractions) {
    Bytes next = base;
    std::bernoulli_distribution pick(fraction);
    for (uint64_t i = 0; i < bytes / 2; ++i) {
      if (!pick(rng)) continue;
      uint16_t v;
      std::memcpy(&v, &next[2 * i], 2);
      v = static_cast<uint16_t>(v + ((rng() & 1) ? 1 : -1));  // one ulp up or down
      std::memcpy(&next[2 * i], &v, 2);
    }
    Row row = Measure(base, next, segments, 2, o.repeat, Kernel(o));
    row.fraction = fraction;
    Print(row, o.json, header);
    header = false;
  }
  return 0;
}
