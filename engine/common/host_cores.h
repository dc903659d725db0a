// HostCoreCount: how many CPUs this process may run on (its affinity mask,
// which containers and taskset narrow), for sizing host thread pools.
#pragma once

namespace megatrain::engine {

// CPU_COUNT of sched_getaffinity; std::thread::hardware_concurrency if that
// fails; at least 1.
int HostCoreCount();

// `requested` when positive, else HostCoreCount(): the meaning of a thread
// count knob whose 0 is "one per core".
int ThreadCountOrCores(int requested);

}  // namespace megatrain::engine
