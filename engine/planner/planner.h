// The planner: before a run, says where every byte of a job lives (exact, from the engine's own
// layout, placement and executor plan), how much host and device memory it peaks at, how long
// a step takes and what limits it; and the largest model of a family a host can train.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/model_config.h"
#include "engine/planner/drive_wear.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/nvme_traffic.h"
#include "engine/planner/step_time.h"
#include "engine/tiers/placement.h"

namespace megatrain::engine::planner {

// Process memory beyond the store, the executor's pinned staging and (CPU device) the arena:
// thread stacks, OpenBLAS buffers, io_uring rings, allocator slack. Measured by
// tests/planner:host_memory_test (docs/planning.md).
inline constexpr uint64_t kDefaultFixedOverheadBytes = uint64_t{4} << 20;

struct PlanInputs {
  int micro_batch = 1;        // sequences per forward/backward
  int seq = 128;              // tokens per sequence
  int grad_accumulation = 1;  // micro-batches per optimizer step
  int checkpoint_interval = 4;
  bool keep_all = false;
  int weight_slots = 2;  // 0 = as many as the arena holds (the executor's auto rule)
  // Fragmented weight streaming: a device ring replaces the slots (weight_slots is then
  // unused). Give its bytes, or its size in layers (ring = ceil(layers x the bytes one layer's
  // tensors take in the ring, StreamingExecutor::LayerRingBytes)); 0 for both = whole slots.
  uint64_t weight_ring_bytes = 0;
  double weight_ring_layers = 0;
  uint64_t fragment_bytes = 0;  // largest fragment; 0 = the executor's default
  // Activation checkpoints on the device; the rest in pinned host memory.
  // kAutoDeviceCheckpoints (-1) = as many as the arena holds (the executor's rule).
  int device_checkpoints = kAutoDeviceCheckpoints;
  int head_chunk = 0;  // 0 = min(tokens, kDefaultHeadChunk = 2048)
  int head_block_rows = 0;  // LM-head vocabulary rows per block; 0 = kDefaultHeadBlockRows (8192)
  // Adaptive recomputation: device bytes for saved activation sets (0 = the
  // k working sets) and how blocks beyond the budget get theirs back.
  uint64_t activation_budget_bytes = 0;
  ActivationPolicyKind activation_policy = ActivationPolicyKind::kRecompute;
  uint64_t device_arena_bytes = 0;  // 0 = the hardware's device memory
  // Devices of one process training the job (--devices): each has its executor's pinned
  // staging, all taken from the one pinned budget.
  int devices = 1;
  // Ranks of a data-parallel job (processes under MPI; 1 = one process): the plan is one rank's.
  // With more than one and a tied embedding, the rank keeps the rows' gradient apart in a second
  // array of the embedding's size, as the Trainer does.
  int ranks = 1;
  // ZeRO-1 over this many ranks (0 or 1: none): the plan is one rank's, its m and v the largest
  // rank's share (Zero1Shards over nvme_chunk_bytes' chunks, as the Trainer cuts them).
  int zero1_world = 0;
  // The most ranks of the job on one machine: they share its NVMe directory's drive, so the drive
  // wear (PlanResult::drive_wear) counts that many writers.
  int ranks_per_machine = 1;
  // Host budgets; unset = everything in RAM, copy endpoints pinned (the Trainer's default).
  bool budgets_enabled = false;
  tiers::TierBudgets budgets;
  bool states_on_nvme = false;
  bool master_on_nvme = false;  // with m and v (tiers::PlacementOptions)
  bool grad_on_nvme = false;    // the gradients too, but the embedding's
  bool compute_copy_on_nvme = false;  // and the compute copy (implies the master)
  // TrainerOptions::speculative_update: the bytes of the alternate master/m/v (NVMe regions, or
  // RAM arrays when the master, m and v are in RAM) are counted
  // (tiers::ReserveAlternateStateRegions) and the placement table says whether it is on.
  // When it is and grad_clip is 0 (every step commits) the step time overlaps the optimizer pass
  // with the last micro-batch's backward (step_time.h point 6); with grad_clip > 0 a clipped step
  // discards it and pays the normal pass, so the step time is the normal one (speculation_note).
  bool speculative_update = false;
  double grad_clip = 0;  // TrainerOptions::grad_clip (global norm; 0 = off)
  // TrainerOptions::grad_clip_rule is kPreviousNorm: a clipped step's speculation commits too
  // while the planned coefficient holds, so the speculation is credited with grad_clip > 0.
  bool previous_norm_clip = false;
  // Where a step's gradients are summed across its micro-batches (ExecutorOptions), resolved as
  // the run and the executor resolve it (GradientAccumulationForRun, then by the arena).
  GradientAccumulation gradient_accumulation = GradientAccumulation::kAuto;
  uint64_t nvme_chunk_bytes = tiers::kDefaultNvmeChunkBytes;  // per array
  uint64_t fixed_overhead_bytes = kDefaultFixedOverheadBytes;
  // Drive wear: optimizer steps of the run (0 = open-ended: judged per day of continuous
  // training) and the warning threshold (off by default).
  uint64_t steps = 0;
  DriveWearLimit drive_wear;
};

struct PlanResult {
  std::string hardware;
  int64_t parameters = 0;
  int64_t padded_elements = 0;
  bool tied_embeddings = false;
  // The accumulation the inputs asked for (executor.gradient_accumulation is what one device
  // resolves it to): several devices decide from the asked one (ReduceOnDevices).
  GradientAccumulation asked_gradient_accumulation = GradientAccumulation::kAuto;
  tiers::Placement placement;     // bytes per tier per buffer kind
  ExecutorOptions executor;       // executor.weight_ring_bytes > 0: fragment mode
  int weight_slots = 0;           // 0 in fragment mode
  int step_fragments = 0;         // fragment mode: weight copies per micro-batch
  uint64_t layer_ring_bytes = 0;  // ring bytes one layer's tensors take
  DeviceMemoryPlan device;        // on the CPU device exact; on a GPU scaled to its dtypes
  uint64_t device_arena_peak = 0;
  uint64_t device_arena_capacity = 0;
  bool fits_device = false;
  uint64_t host_store_bytes = 0;     // placement: pinned + RAM (NVMe staging included)
  uint64_t host_pinned_staging = 0;  // executor: gradient staging + host checkpoints (one device)
  // host_pinned_staging x devices (ExecutorPinnedStagingBytes): set aside from the pinned budget
  // before the store is placed, when budgets are given (placement.pinned_reserved then).
  uint64_t pinned_reserved = 0;
  // With budgets: the store and the executor's pinned staging (host checkpoints included) fit
  // pinned + RAM; true without budgets.
  bool fits_host = true;
  uint64_t host_fixed_overhead = 0;
  uint64_t host_arena_bytes = 0;  // CPU device: the emulated device memory is host RAM
  uint64_t host_peak_bytes = 0;   // predicted VmHWM growth of a training process
  uint64_t nvme_bytes = 0;
  NvmeTraffic nvme_traffic;  // bytes per optimizer step (exact)
  DriveWearLimit drive_wear_limit;
  DriveWear drive_wear;  // per day at time.step_seconds; the warning when over the limit
  StepTimeEstimate time;
  double tokens_per_step = 0;
  // What `time` replayed (NVMe traffic included) and the optimizer pass's NVMe bytes per entry:
  // the input of derived predictions (PredictDataParallel).
  StepWork work;
  NvmeEntryIo nvme_io;
  // The predicted per-block activation modes (from the profile's link and
  // compute); executor.block_modes holds them and the step time uses them.
  ActivationDecision activation;
  // With inputs.speculative_update: whether the step time credits its overlap, and why (or why
  // not); empty without it.
  bool speculation_credited = false;
  std::string speculation_note;

  std::string Table() const;
  std::string ToJson() const;
};

absl::StatusOr<PlanResult> Plan(const ModelConfig& config, const PlanInputs& inputs,
                                const HardwareProfile& hardware);

struct LargestFit {
  int num_layers = 0;
  int64_t parameters = 0;
  PlanResult plan;
};

// The deepest model of `family_template`'s shape (its width, heads, vocab; num_hidden_layers
// varied) whose plan fits the host budgets (placement) and the device. NOT_FOUND when not even
// one layer fits.
absl::StatusOr<LargestFit> LargestModelThatFits(const ModelConfig& family_template,
                                                const PlanInputs& inputs,
                                                const HardwareProfile& hardware);

}  // namespace megatrain::engine::planner
