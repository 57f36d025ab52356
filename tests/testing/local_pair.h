// A publisher and subscribers in one process, over a real Unix socket and real shared memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::testing {

struct LocalPair {
  SyntheticModel model{12, 3000};
  std::string endpoint = testing::UniqueEndpoint("rt");
  std::unique_ptr<Publisher> publisher;
  std::chrono::milliseconds timeout{10000};  // the publisher's
  int ring_buckets = 0;                      // > 0: a ring publisher (PublisherOptions)
  uint64_t ring_bucket_bytes = 0;
  int max_direct = 0;  // PublisherOptions::max_direct
  std::vector<NamedTensor> tensors = model.Tensors();
  std::vector<std::vector<uint8_t>> storage = SyntheticModel::PoisonedStorage(tensors);
  std::vector<NamedTensor> dst = SyntheticModel::Views(tensors, storage);

  std::unique_ptr<Subscriber> Connect(UpdateMode mode = UpdateMode::kStaged, bool verify = true) {
    return ConnectWith(dst, mode, verify);
  }
  std::unique_ptr<Subscriber> ConnectWith(const std::vector<NamedTensor>& views,
                                          UpdateMode mode = UpdateMode::kStaged, bool verify = true,
                                          MatchPolicy policy = MatchPolicy::kStrict) {
    SubscriberOptions o;
    o.policy = policy;
    o.endpoint = endpoint;
    o.mode = mode;
    o.verify = verify;
    o.timeout = std::chrono::milliseconds(5000);
    return NewSubscriber(o, views);
  }
  void Start(int slots = 2) {
    PublisherOptions o;
    o.endpoint = endpoint;
    o.slots = slots;
    o.timeout = timeout;
    o.segment_bytes = 4096;  // many segments even for a small model
    o.ring_buckets = ring_buckets;
    o.ring_bucket_bytes = ring_bucket_bytes;
    o.max_direct = max_direct;
    ASSERT_OK_AND_ASSIGN(publisher, Publisher::Create(o));
    endpoint = publisher->endpoint();  // tcp://HOST:0 → the bound port
    ASSERT_OK(publisher->Register(tensors));
  }
  void Publish(int64_t step) {
    ASSERT_NE(publisher, nullptr) << "Start() failed";
    model.Fill(step);
    auto r = publisher->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
};

}  // namespace weightsync::testing
