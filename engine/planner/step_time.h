// The step-time model: the work of every op of the executor's actual schedule (GEMM and
// attention FLOPs including recompute, element-wise bytes, weight bytes copied in, gradient and
// checkpoint bytes copied out), replayed through the executor's three-stream pipeline.
//
// Overlap model (the executor's event choreography, streaming_executor.h):
//  1. copy_in: op j's weights start when the previous copy-in ended, the slot's previous
//     reader finished computing, and the entry's optimizer update of this step is done.
//     Which ops copy at all is decided by the executor's own WeightSlotPolicy.
//     Fragment mode (a weight ring of C bytes): every op copies its weights, as the
//     executor's fragment plan cuts them (each fragment pays the link latency). Weights form
//     one FIFO byte stream through the ring: op j's bytes [S, S+W) overwrite stream bytes
//     [S-C, S+W-C), read by earlier ops (or, when W > C, by op j itself) that free them as
//     their compute progresses (linearly in the model). So the copy starts once its first
//     fragment's room is free and ends no earlier than the room of its last one; the op's
//     compute starts when its first fragment arrived and cannot end before its last one did
//     (copy and compute of one op overlap, as the executor's parts do). With C >= 2 layers
//     this is double buffering; with one layer, copies run at most one layer ahead.
//  2. compute: op j starts when op j-1 finished, its weights (and host checkpoint) arrived and
//     its gradient buffer (2, alternating) was drained by copy_out.
//  3. copy_out: gradients leave after the op's compute, in order (data parallel: after the
//     devices' reduce-scatter of them, OpWork::reduce_seconds). Gradients on NVMe: the
//     copy-out stream also writes them to the NVMe tier (the first micro-batch of the step) or
//     reads the running sum back and writes it again (each later one); the write-back is
//     asynchronous (overlaps the next chunk's device-to-host copy), the read-back is not:
//     op copy-out = max(device-to-host, NVMe write) + NVMe read + host add.
//  4. Host optimizer: entry e's update of the previous step runs in forward order from the
//     start of the step, each entry taking max(AdamW, its NVMe I/O: m, v, master read + written,
//     gradient read) (read-ahead pipelines the two). On a GPU it overlaps the forward; on the CPU
//     device compute and AdamW share the cores, so AdamW's time is added and only NVMe I/O
//     overlaps. Across nodes (ZeRO-1) each entry's update is followed by the network all-gather
//     of its compute copy (StepWork::entry_gather_seconds) before its copy-in may start.
//  5. The gradient-norm pass (4 bytes/param read on the host) is serial after backward.
//  6. Speculative update (StepWork::speculative_update, credited only where it commits: the
//     planner sets it for grad_clip 0): point 4's pass of this step runs instead during the last
//     micro-batch's backward (speculation_time.h): entry e starts once its gradient is final
//     (the copy-out of its last contribution ended), entries in that order on one host thread,
//     each taking max(AdamW, its NVMe I/O) (CPU device: the I/O; AdamW stays charged in full).
//     Its NVMe reads are the master, m and v (the gradient is still in the staging); the pass
//     cannot end before its start + its NVMe time + the backward's gradient I/O after its start
//     (one disk). Nothing gates the next forward: the step ends at max(pipeline + norm pass,
//     speculation end), so only the pass's remainder past the backward is exposed. A clipped
//     step discards it and pays point 4's pass after it: the planner does not credit it then.
//     With the master, m and v in RAM (the RAM form: alternate arrays, no NVMe traffic) an
//     entry's time is its host AdamW alone: the overlapped part is AdamW, which on a GPU is what
//     otherwise gates the next forward layer by layer.
#pragma once

#include <string>
#include <vector>

#include "engine/exec/streaming_executor.h"
#include "engine/planner/executor_geometry.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/nvme_traffic.h"

namespace megatrain::engine::planner {

struct OpWork {
  ScheduledOp op;
  double gemm_flops = 0;       // dense matmuls (projections, MLP, LM head)
  double attention_flops = 0;  // causal attention matmuls (half the square)
  double elementwise_bytes = 0;
  double copy_in_bytes = 0;        // weights (0 when the slot already holds them) + checkpoint
  double weight_bytes = 0;         // of copy_in_bytes: the op's weights
  double copy_out_bytes = 0;       // gradients + checkpoint
  double gradient_bytes = 0;       // of copy_out_bytes: the op's layer/head gradients (reducible)
  // Data parallel (data_parallel.h): the devices' reduce-scatter of this op's gradients before
  // its copy-out, on the copy-out stream.
  double reduce_seconds = 0;
  double accumulate_elements = 0;  // gradients added into a slab on the host (accumulation)
  // Entries whose gradients this op adds to their sums on the device and does not copy out
  // (GradientAccumulation::kDevice, before the step's last micro-batch).
  std::vector<int> kept_on_device;
  double nvme_read_bytes = 0;      // copy-out: gradient sums read back from NVMe
  double nvme_write_bytes = 0;     // copy-out: gradients written to NVMe
  double nvme_weight_bytes = 0;    // copy-in: the compute copy read from NVMe
  int copies = 0;                  // separate transfers (each pays the link latency)
};

struct StepWork {
  std::vector<OpWork> ops;  // all micro-batches of one optimizer step
  double parameters = 0;
  double optimizer_elements = 0;  // padded floats AdamW passes over
  std::vector<double> entry_elements;
  // ZeRO-1 across nodes (data_parallel.h): seconds of entry e's network all-gather of its updated
  // compute copy, after its update and before its next copy-in (empty = one node).
  std::vector<double> entry_gather_seconds;
  double model_flops = 0;     // 6 * P_flop * tokens + causal attention (see docs/planning.md)
  double hardware_flops = 0;  // everything the schedule runs, recompute included
  double tokens = 0;
  int micro_batches = 1;         // of the step
  int weight_slots = 2;          // a copy may run this many copies ahead of the compute reading it
  double weight_ring_bytes = 0;  // > 0: fragment mode through a ring of this size
  // The optimizer pass runs during the last micro-batch's backward (protocol point 6).
  bool speculative_update = false;
};

// In fragment mode (options.weight_ring_bytes > 0) `weight_slots` is unused.
StepWork BuildStepWork(const ExecutorGeometry& g, const ExecutorOptions& options, int weight_slots,
                       int micro_batches, const HardwareProfile& hw, double flop_parameters);

// Gradients on NVMe: entry e's gradient_bytes[e] (NvmeEntryIo) are written by the copy-out of
// the op producing them, and read back first from its second contribution of the step on.
void AddNvmeGradientTraffic(StepWork& work, const std::vector<double>& gradient_bytes);

// The compute copy on NVMe: every op that copies weights reads its entries' compute_copy_bytes
// (NvmeEntryIo) from NVMe; the weight copy takes the longer of the link and the disk.
void AddNvmeWeightTraffic(StepWork& work, const std::vector<double>& compute_copy_bytes);

// Seconds the op computes on the device of the profile.
double OpComputeSeconds(const OpWork& op, const HardwareProfile& hw);

struct StepTimeEstimate {
  // Sums of each resource's busy time over the step (seconds).
  double compute_seconds = 0;
  double copy_in_seconds = 0;
  double copy_out_seconds = 0;
  double optimizer_seconds = 0;       // host AdamW over all entries
  double nvme_seconds = 0;  // NVMe busy time: optimizer pass + gradient I/O + weight reads
  // m, v, master read + written, gradients read (a speculative pass: not the gradients, which
  // it finds in the staging)
  double nvme_optimizer_seconds = 0;
  double nvme_backward_seconds = 0;   // gradients written (and read back) by copy-out
  double nvme_weights_seconds = 0;    // the compute copy read by the weight copies
  double grad_norm_seconds = 0;
  // Speculative update (point 6): when its pass ended, and how much of it lay beyond the
  // pipeline and the norm pass (the rest hid behind the backward). 0 without it.
  double speculation_end_seconds = 0;
  double speculation_exposed_seconds = 0;
  // The pipeline: when the last op ended, and the time compute waited for copies or updates.
  double pipeline_seconds = 0;
  double stall_seconds = 0;
  double step_seconds = 0;  // wall time per optimizer step
  std::string bottleneck;   // compute, copy-in, copy-out, host optimizer, nvme
  double tokens_per_second = 0;
  double model_tflops = 0;
  double hardware_tflops = 0;
};

// nvme: the optimizer pass's NVMe bytes per entry (optimizer_read/optimizer_written; empty =
// nothing on NVMe). The gradients' copy-out traffic is in the ops (AddNvmeGradientTraffic).
StepTimeEstimate EstimateStepTime(const StepWork& work, const HardwareProfile& hw,
                                  const NvmeEntryIo& nvme = {});

}  // namespace megatrain::engine::planner
