// When the speculative optimizer update ends (TrainerOptions::speculative_update, step_time.h
// point 6): each entry's update runs on one host thread as soon as its gradient is final in the
// last micro-batch's backward, in the order they became final, and shares the disk with the
// backward's own NVMe gradient traffic.
#pragma once

#include <vector>

namespace megatrain::engine::planner {

// The backward's NVMe gradient I/O of one op's copy-out: `seconds` of disk time spread over the
// copy-out's span [start, end].
struct DiskBusy {
  double start = 0;
  double end = 0;
  double seconds = 0;
};

struct SpeculationInputs {
  // Per entry: when its gradient became final (seconds from the step's start; < 0 = never, e.g.
  // an entry without gradients), and the seconds of its update: the host thread's (max of AdamW
  // and its NVMe I/O on a GPU, the NVMe I/O alone on the CPU device, whose AdamW is charged to
  // the shared cores) and, of that, the disk's. With the master, m and v in RAM there is no NVMe
  // I/O: on a GPU an entry takes its host AdamW, and that is what overlaps the backward. In the
  // mixed form (the master in RAM, m and v on NVMe) the I/O is m's and v's alone (read, and
  // written to their alternate regions; the master goes to its alternate array in RAM): an entry
  // takes max(AdamW, that I/O) on a GPU, the I/O on the CPU device.
  std::vector<double> entry_final;
  std::vector<double> entry_seconds;
  std::vector<double> entry_nvme_seconds;
  std::vector<DiskBusy> backward_nvme;  // the step's gradient copy-outs to NVMe
};

struct SpeculationTiming {
  double start = 0;      // the first entry's gradient final: the pass begins
  double chain_end = 0;  // the host thread's last entry done, the disk ignored
  double disk_end = 0;   // start + the pass's NVMe time + the backward's NVMe time after start
  double end = 0;        // max(chain_end, disk_end)
  double busy = 0;       // the thread's update time, all entries
};

SpeculationTiming ReplaySpeculation(const SpeculationInputs& in);

}  // namespace megatrain::engine::planner
