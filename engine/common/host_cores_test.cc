// HostCoreCount follows the affinity mask; ThreadCountOrCores keeps explicit counts.
#include "engine/common/host_cores.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace megatrain::engine {
namespace {

TEST(HostCoresTest, CountsTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(HostCoreCount(), CPU_COUNT(&set));
  EXPECT_GE(HostCoreCount(), 1);
}

TEST(HostCoresTest, ZeroMeansOnePerCoreAndExplicitCountsStay) {
  EXPECT_EQ(ThreadCountOrCores(0), HostCoreCount());
  EXPECT_EQ(ThreadCountOrCores(-1), HostCoreCount());
  EXPECT_EQ(ThreadCountOrCores(3), 3);
}

}  // namespace
}  // namespace megatrain::engine
