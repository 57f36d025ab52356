// The arena reserves address space up front; where a limit refuses the full reservation (ulimit -v,
// a sanitizer's layout) it must fall back to a smaller one instead of failing Publisher::Create.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testing/test_util.h"
#include "util/address_space.h"

namespace weightsync {
namespace {

TEST(HostArena, PublisherWorksUnderAnAddressSpaceLimit) {
  const std::string endpoint = testing::UniqueEndpoint("arena-limit");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // 1 GiB more address space than in use (sanitizers map terabytes of shadow before main):
    // far less than the default 1 TiB reservation.
    const unsigned long long cap = util::AddressSpaceInUse() + (1ull << 30);
    rlimit limit{cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(3);
    PublisherOptions o;
    o.endpoint = endpoint;
    auto pub = Publisher::Create(o);
    if (!pub.ok()) ::_exit(1);
    std::vector<float> w(1024, 1.0f);
    if (!(*pub)->Register({{"w", {w.data(), DType::kFloat32, {1024}}}}).ok()) ::_exit(2);
    ::_exit((*pub)->Publish(1).ok() ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: Create failed, 2: Register, 3: setrlimit, 4: Publish";
}

}  // namespace
}  // namespace weightsync
