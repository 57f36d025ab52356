// A publisher of `Source`'s tensors and subscribers into `Destinations`' (both structs with
// Tensors(); Source also Fill(step)), over every TransportMode: the fixture of the suites that
// check conversions in flight into host destinations (casts and fp8, MXFP8 and NVFP4).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"
#include "weightsync/weightsync.h"

namespace weightsync::testing {

template <typename Source, typename Destinations>
class ConvertFixture : public ::testing::TestWithParam<TransportMode> {
 protected:
  void SetUp() override {
    PublisherOptions o;
    o.endpoint = GetParam().tcp ? "tcp://127.0.0.1:0" : UniqueEndpoint("convert");
    o.segment_bytes = 4096;
    ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
    ASSERT_OK(pub_->Register(src_.Tensors()));
  }
  std::unique_ptr<Subscriber> Connect(bool convert = true) {
    SubscriberOptions o;
    o.endpoint = pub_->endpoint();
    o.mode = GetParam().mode;
    o.verify = true;
    o.convert_dtypes = convert;
    return NewSubscriber(o, dst_.Tensors());
  }
  void Publish(int64_t step) {
    src_.Fill(step);
    ASSERT_OK(pub_->Publish(step));
  }
  // Publishes step 2 after step 1 landed and flips one received byte of it: the update must fail
  // with Corruption. Staged, `unchanged()` must then hold (nothing converted); in place the
  // weights are invalid. The next update must succeed.
  template <typename Check>
  void ExpectACorruptStepConvertsNothing(std::unique_ptr<Subscriber>& sub, Check unchanged) {
    Publish(1);
    ASSERT_OK(sub->Update());
    Publish(2);
    util::FailPoints::Arm("subscriber.flip_received", util::FailAction::kFlip, 0, 1);
    auto r = sub->Update();
    util::FailPoints::DisarmAll();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status();
    if (GetParam().mode == UpdateMode::kStaged) {
      unchanged();
    } else {
      EXPECT_FALSE(sub->weights_valid());
    }
    auto again = sub->Update();
    ASSERT_TRUE(again.ok()) << again.status();
  }

  Source src_;
  Destinations dst_;
  std::unique_ptr<Publisher> pub_;
};

}  // namespace weightsync::testing
