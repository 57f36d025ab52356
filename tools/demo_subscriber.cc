#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "demo_roles.h"
#include "demo_tensors.h"
#include "harness/alloc_counter.h"
#include "harness/byte_units.h"
#include "harness/proc_stats.h"
#include "harness/sample_stats.h"
#include "progress.h"
#include "step_pipe.h"
#include "weightsync/subscriber.h"

namespace weightsync::tools {
namespace {

struct StepRecord {
  UpdateStats stats;
  uint64_t allocations = 0;  // subscriber process, during Update(), drawing thread excluded
  PublishedMessage published;
  uint64_t rss = 0;  // resident bytes after the step was checked
};

void PrintHeader() {
  std::printf("%9s %11s %11s %8s %8s  %-24s %10s %12s\n", "step", "bytes", "update ms", "GB/s",
              "handle", "verified", "sub allocs", "pub ms");
}

void PrintStep(const StepRecord& r, int64_t steps, size_t tensors, bool verify) {
  const UpdateStats& s = r.stats;
  char verified[64];
  std::snprintf(verified, sizeof(verified), "%s + %zu/%zu tensors",
                verify ? (s.verified ? "digests" : "DIGESTS?") : "(off)", tensors, tensors);
  std::printf("%4lld/%-4lld %7.1f MiB %11.1f %8.2f %8s  %-24s %10llu %12.1f\n",
              static_cast<long long>(s.step), static_cast<long long>(steps), s.bytes / 1048576.0,
              s.seconds * 1e3, s.gbps, s.handle_created ? "created" : "reused", verified,
              static_cast<unsigned long long>(r.allocations), r.published.publish_seconds * 1e3);
  std::fflush(stdout);
}

void PrintSummary(const DemoOptions& o, const DemoModel& model, const std::vector<StepRecord>& r,
                  uint64_t rss_before) {
  std::vector<double> steady, copy, verify, commit, fill, publish, sub_allocs, pub_allocs;
  for (size_t i = 1; i < r.size(); ++i) {
    steady.push_back(r[i].stats.seconds);
    copy.push_back(r[i].stats.copy_seconds);
    verify.push_back(r[i].stats.verify_seconds);
    commit.push_back(r[i].stats.commit_seconds);
    sub_allocs.push_back(static_cast<double>(r[i].allocations));
    pub_allocs.push_back(static_cast<double>(r[i].published.publish_allocations));
  }
  // A step's first use of an arena slot also pays for faulting the slot's pages in.
  const size_t first_reuse = r.size() > static_cast<size_t>(o.slots) ? o.slots : 0;
  for (size_t i = first_reuse; i < r.size(); ++i) {
    fill.push_back(r[i].published.fill_seconds);
    publish.push_back(r[i].published.publish_seconds);
  }
  const UpdateStats& first = r.front().stats;
  std::printf("\nsummary: %s, scale %g: %zu tensors, %s %s, %zu steps, %s, verify %s, path %s\n",
              model.config.name.c_str(), model.scale, model.tensors.size(),
              bench::FormatBytes(model.bytes).c_str(), std::string(DTypeName(model.dtype)).c_str(),
              r.size(), o.mode.c_str(), o.verify ? "on" : "off", std::string(first.path).c_str());
  constexpr char kRow[] = "  %-34s ";
  std::printf(kRow, "first update (prepares the handle)");
  std::printf("%9.1f ms   prepare %.1f, copy %.1f, verify %.1f, commit %.1f ms\n",
              first.seconds * 1e3, first.prepare_seconds * 1e3, first.copy_seconds * 1e3,
              first.verify_seconds * 1e3, first.commit_seconds * 1e3);
  if (!steady.empty()) {
    const double median = bench::Median(steady);
    std::printf(kRow, "steady-state update, median");
    std::printf("%9.1f ms   %.2f GB/s; copy %.1f, verify %.1f, commit %.1f ms\n", median * 1e3,
                model.bytes / median / 1e9, bench::Median(copy) * 1e3, bench::Median(verify) * 1e3,
                bench::Median(commit) * 1e3);
    std::printf(kRow, "");
    std::printf("%12s   steps 2..%zu: min %.1f, max %.1f ms\n", "", r.size(),
                *std::min_element(steady.begin(), steady.end()) * 1e3, bench::Max(steady) * 1e3);
    std::printf(kRow, "first / steady-state");
    std::printf("%9.1fx\n", first.seconds / median);
    std::printf(kRow, "heap allocations per steady step");
    std::printf("subscriber Update %.0f (max %.0f), publisher Publish %.0f (max %.0f)\n",
                bench::Mean(sub_allocs), bench::Max(sub_allocs), bench::Mean(pub_allocs),
                bench::Max(pub_allocs));
    std::printf(kRow, "");
    std::printf("each: whole process, all threads, counted by a malloc hook\n");
  } else {
    std::printf("  steady state: needs --steps ≥ 2\n");
  }
  std::printf(kRow, "publisher, median per step");
  std::printf("fill %.1f ms (new weights), publish %.1f ms (slot copy + digests)\n",
              bench::Median(fill) * 1e3, bench::Median(publish) * 1e3);
  std::printf(kRow, "");
  std::printf("steps %zu..%zu; first publish %.1f ms (faults its slot in)\n", first_reuse + 1,
              r.size(), r.front().published.publish_seconds * 1e3);
  // Each arena slot is mapped (and counted in RSS) the first time a step lands in it, so the
  // steady-state comparison starts once every slot has been used.
  const size_t settled = std::min<size_t>(static_cast<size_t>(o.slots), r.size()) - 1;
  std::printf(kRow, "subscriber RSS");
  std::printf("before the first update %s, after it %s\n", bench::FormatBytes(rss_before).c_str(),
              bench::FormatBytes(r.front().rss).c_str());
  std::printf(kRow, "");
  std::printf("after step %zu (every arena slot mapped) %s, after step %zu %s\n", settled + 1,
              bench::FormatBytes(r[settled].rss).c_str(), r.size(),
              bench::FormatBytes(r.back().rss).c_str());
  std::printf(kRow, "");
  std::printf("growth over the last %zu steps: %+lld bytes\n", r.size() - 1 - settled,
              static_cast<long long>(r.back().rss) - static_cast<long long>(r[settled].rss));
}

}  // namespace

int RunDemoSubscriber(const DemoOptions& o) {
  auto fail = [&](const Status& s, int64_t step) {
    std::fprintf(stderr, "demo subscriber: step %lld: %s\n", static_cast<long long>(step),
                 s.ToString().c_str());
    DoneMessage done{step, 0};
    (void)WriteMessage(o.ack_fd, &done, sizeof(done));
    return 1;
  };
  Result<DemoModel> model = BuildDemoModel(o);
  if (!model.ok()) return fail(model.status(), 0);
  Result<Device> device = ParseDemoDevice("subscriber-device", SubscriberDeviceText(o));
  if (!device.ok()) return fail(device.status(), 0);
  // Poisoned: a byte the update failed to write cannot match its expected digest by accident.
  Result<DemoTensors> created_storage = DemoTensors::Create(model->tensors, *device, 0xFF);
  if (!created_storage.ok()) return fail(created_storage.status(), 0);
  DemoTensors storage = std::move(created_storage).value();
  SubscriberOptions so;
  so.endpoint = o.endpoint;
  so.mode = ParseMode(o.mode);
  so.verify = o.verify;
  so.copy_threads = static_cast<int>(o.copy_threads);
  so.timeout = std::chrono::milliseconds(o.timeout_ms);
  Result<std::unique_ptr<Subscriber>> created = Subscriber::Create(so);
  if (!created.ok()) return fail(created.status(), 0);
  std::unique_ptr<Subscriber> subscriber = std::move(created).value();
  if (Status s = subscriber->Register(storage.Views()); !s.ok()) return fail(s, 0);
  if (!bench::AllocCounterActive()) {
    std::fprintf(stderr,
                 "demo subscriber: the allocation counter is not active; allocation "
                 "figures below are meaningless\n");
  }

  const bool show_progress =
      o.progress == "always" || (o.progress == "auto" && ::isatty(STDERR_FILENO));
  ProgressBar progress(show_progress);
  std::vector<StepRecord> records;
  records.reserve(static_cast<size_t>(o.steps));
  const uint64_t rss_before = bench::ResidentBytes();
  PrintHeader();
  for (int64_t step = 1; step <= o.steps; ++step) {
    StepRecord r;
    Status s = ReadMessage(o.notify_fd, &r.published, sizeof(r.published),
                           std::chrono::milliseconds(o.timeout_ms));
    if (!s.ok()) return fail(s.WithContext("waiting for the publisher"), step);
    progress.Begin(step, model->bytes, records.empty() ? 0 : records.back().stats.seconds);
    const uint64_t drawn_before = progress.thread_allocations();
    const bench::AllocCounts a0 = bench::ProcessAllocations();
    Result<UpdateStats> stats = subscriber->Update(step);
    const bench::AllocCounts a1 = bench::ProcessAllocations();
    progress.End();
    if (!stats.ok()) return fail(stats.status(), step);
    r.stats = *stats;
    r.allocations = (a1 - a0).allocations - (progress.thread_allocations() - drawn_before);
    if (o.verify && !r.stats.verified) {
      return fail(Status::Internal("Update() returned without verifying"), step);
    }
    std::string first_bad;
    Result<size_t> bad = storage.CountWrong(step, &first_bad);
    if (!bad.ok()) return fail(bad.status().WithContext("checking the tensors"), step);
    if (*bad != 0) {
      return fail(Status::Corruption(*bad, " of ", storage.size(),
                                     " tensors differ from the "
                                     "expected bytes, first '",
                                     first_bad, "'"),
                  step);
    }
    r.rss = bench::ResidentBytes();
    records.push_back(r);
    PrintStep(r, o.steps, storage.size(), o.verify);
    DoneMessage done{step, 1};
    if (Status w = WriteMessage(o.ack_fd, &done, sizeof(done)); !w.ok()) return fail(w, step);
  }
  PrintSummary(o, *model, records, rss_before);
  if (Status s = subscriber->Close(); !s.ok()) {
    std::fprintf(stderr, "demo subscriber: close: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("  %-34s %zu/%zu steps (%sexpected digest of every tensor)\n", "verified",
              records.size(), records.size(), o.verify ? "publisher's digests + " : "");
  std::fflush(stdout);
  return 0;
}

}  // namespace weightsync::tools
