// StartThread: std::thread reports a refused thread (EAGAIN under a thread or address-space limit)
// by throwing std::system_error. No exception may cross our API, so every thread the library
// starts goes through here and a refusal becomes a Status naming what could not be started.
#pragma once

#include <new>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "weightsync/status.h"

namespace weightsync::util {

template <typename Fn>
Status StartThread(std::thread* thread, std::string_view what, Fn&& fn) {
  try {
    *thread = std::thread(std::forward<Fn>(fn));
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted("cannot start the ", what, " thread: ", e.what(),
                                     " (thread or address-space limit?)");
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("cannot start the ", what, " thread: out of memory");
  }
  return Status::Ok();
}

}  // namespace weightsync::util
