// HostCoreCount through sched_getaffinity (Linux).
#include "engine/common/host_cores.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace megatrain::engine {

int HostCoreCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int ThreadCountOrCores(int requested) { return requested > 0 ? requested : HostCoreCount(); }

}  // namespace megatrain::engine
