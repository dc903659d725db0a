// The speculative update's pass during the backward (see speculation_time.h).
#include "engine/planner/speculation_time.h"

#include <algorithm>
#include <numeric>

namespace megatrain::engine::planner {

SpeculationTiming ReplaySpeculation(const SpeculationInputs& in) {
  SpeculationTiming t;
  std::vector<size_t> order;
  for (size_t e = 0; e < in.entry_final.size(); ++e) {
    if (in.entry_final[e] >= 0) order.push_back(e);
  }
  if (order.empty()) return t;
  // The trainer's queue: entries in the order their gradients became final (stable: ties keep
  // the entry order, as one op's entries are reported together).
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return in.entry_final[a] < in.entry_final[b]; });
  t.start = in.entry_final[order.front()];
  double clock = t.start;
  double nvme = 0;
  for (size_t e : order) {
    clock = std::max(clock, in.entry_final[e]) + in.entry_seconds[e];
    t.busy += in.entry_seconds[e];
    nvme += in.entry_nvme_seconds[e];
  }
  t.chain_end = clock;
  // One disk: from the pass's start it also serves what is left of the backward's gradient I/O
  // (the part of each copy-out's span after the start).
  double backward = 0;
  for (const DiskBusy& b : in.backward_nvme) {
    if (b.seconds <= 0 || b.end <= t.start) continue;
    const double span = b.end - b.start;
    backward += span > 0 ? b.seconds * std::min(1.0, (b.end - t.start) / span) : b.seconds;
  }
  t.disk_end = t.start + nvme + backward;
  t.end = std::max(t.chain_end, t.disk_end);
  return t;
}

}  // namespace megatrain::engine::planner
