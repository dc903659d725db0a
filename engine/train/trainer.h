// The trainer: owns the parameter store, the streaming executor and the host
// optimizer of one job, and runs optimizer steps (micro-batches, loss,
// global-norm clipping, AdamW overlapped with the next step's forward, skipping
// of non-finite steps).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/checkpoint/checkpointable.h"
#include "engine/common/input_files.h"
#include "engine/common/thread_pool.h"
#include "engine/device/device.h"
#include "engine/dist/communicator.h"
#include "engine/exec/parameter_store.h"
#include "engine/exec/streaming_executor.h"
#include "engine/exec/update_gate.h"
#include "engine/exec/zero1_shards.h"
#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"
#include "engine/optimizer/host_adamw.h"
#include "engine/tiers/placement.h"
#include "engine/train/grad_clip_rule.h"
#include "engine/train/gradient_reduction.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/multi_device_step.h"
#include "engine/train/speculative_update.h"
#include "engine/train/step_report.h"
#include "kernels/cpu/rope.h"

namespace megatrain::engine {

// Host memory budgets (issue: memory tiers). Unset = every buffer in RAM, the
// copy endpoints (master, gradients) pinned.
struct HostMemoryBudgets {
  bool enabled = false;
  tiers::TierBudgets budgets;   // pinned_ram, ram, nvme_dir, nvme_bytes (bytes)
  bool states_on_nvme = false;  // m and v on NVMe even when RAM could hold them
  // The fp32 master on NVMe too, streamed with m and v (on the CPU device
  // behind a pinned fp32 compute copy; see tiers::PlacementOptions).
  bool master_on_nvme = false;
  // The fp32 gradients on NVMe too (all but the embedding's), even when RAM
  // could hold them; the placement also moves them when RAM overflows.
  bool grad_on_nvme = false;
  // The compute copy on NVMe too (with the master, so the CPU device's fp32
  // copy exists): weights stream from NVMe in step order; all but the
  // embedding's (gathered by rows on the host).
  bool compute_copy_on_nvme = false;
  // Bytes per array of the chunks NVMe traffic and the host optimizer work in
  // (StorePlacement::nvme_chunk_bytes); results never depend on it. Read with or
  // without `enabled` under ZeRO-1, whose shards are whole chunks: every rank must
  // use the same (Trainer::Create checks), and a checkpoint's piece names follow it.
  size_t nvme_chunk_bytes = StorePlacement::kDefaultNvmeChunkBytes;
  tiers::BlockIo* block_io_for_tests = nullptr;  // null = io_uring (see StorePlacement)
};

struct TrainerOptions {
  int micro_batch_size = 1;  // sequences per forward/backward
  int seq_len = 128;
  int head_chunk = 0;  // tokens per LM-head chunk; 0 = min(tokens, kDefaultHeadChunk = 2048)
  // LM-head rows per vocabulary block; 0 = kDefaultHeadBlockRows. On a GPU keep it a multiple
  // of 64: blocks start at first_row * d and their logits rows are block_rows wide.
  int head_block_rows = 0;
  LrScheduleOptions lr;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;      // applied to 2-D weights only
  double grad_clip = 1.0;         // global L2 norm; 0 = off
  // How a step's clip coefficient is chosen (docs/operations.md "Clip rules"); with grad_clip > 0.
  GradClipRule grad_clip_rule = GradClipRule::kExact;
  // kPreviousNorm: the coefficient is planned from headroom x the previous norm (>= 1).
  double grad_clip_headroom = kDefaultGradClipHeadroom;
  int max_consecutive_skips = 5;  // non-finite steps in a row before the job fails
  ExecutorOptions executor;
  // Several devices of one process, or one device per rank: where their gradients meet
  // (gradient_reduction.h).
  GradientReduction gradient_reduction = GradientReduction::kAuto;
  HostMemoryBudgets memory;
  // Host AdamW and gradient-norm threads; 0 = one per core this process may run on
  // (HostCoreCount). Results do not depend on it (host_adamw_test
  // ResultsDoNotDependOnThreadCount, grad_norm_test IdenticalBitsForAnyThreadCountAndIsa).
  int optimizer_threads = 0;
  int blas_threads = 2;          // fixed for the run: OpenBLAS results depend on it
  bool collect_timeline = true;  // per-layer timings in StepReport (two clock reads per op)
  // Data parallelism (docs/scale_out.md): the ranks this trainer steps with, each passing its
  // own micro-batches to Step; counts, loss sums and gradients are combined in rank order before
  // the norm (data_parallel_step.h). Null = this process alone. Not owned.
  dist::Communicator* communicator = nullptr;
  // ZeRO-1 over `communicator` (docs/scale_out.md): each rank owns a range of whole chunks of
  // every parameter-store entry (Zero1Shards over memory.nvme_chunk_bytes' chunks, so each holds
  // about 1/W of m and v however large one entry is), reduces its ranges' gradients to itself,
  // updates them, and broadcasts their masters. Needs a communicator; gradients, m and v may be
  // on NVMe, the masters too on the CPU device (its fp32 compute copy is then broadcast). Its ranks checkpoint together with WriteShardedCheckpoint (WriteCheckpoint
  // refuses a shard); loading any checkpoint restores the owned ranges' m and v and every master,
  // so checkpoints resume on any world size.
  bool zero1 = false;
  // The deadline of each collective among the devices' reduction (NCCL: from when the stream
  // reaches it; dist::NcclOptions::collective_timeout), past which the step fails naming the
  // rank: a peer GPU or process that hangs. InfiniteDuration: none.
  absl::Duration collective_timeout = absl::Minutes(2);
  // Speculative update (docs/operations.md): during the last micro-batch's backward, each entry
  // whose gradient is final is updated with clip coefficient 1, out of place, into a second
  // copy of its master, m and v; committed when the step's clip coefficient is exactly 1
  // (bitwise the normal update), discarded otherwise. With the master, m and v on NVMe the copy
  // is alternate regions of the state file (NVMe room for it); with them in RAM, alternate
  // arrays in RAM (12 bytes per parameter more, within the pinned and RAM budgets); with the
  // master in RAM and m and v on NVMe (the mixed form), both: an alternate master array (4 bytes
  // per parameter of the master's tier) and alternate m/v regions (8 bytes of NVMe). Else off,
  // said in placement_table(); off under a communicator or ZeRO-1.
  bool speculative_update = false;
};

// The optimizer's position (TrainerProgress) and what a checkpoint needs of a trainer
// (Checkpointable) live in engine/checkpoint, below this room.
class Trainer : public Checkpointable {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Device& device, ModelConfig config,
                                                         const TrainerOptions& options);
  // Several devices of one process (docs/scale_out.md "Several devices in one
  // process"): one executor per device over the one store; micro-batch m of a
  // step runs on devices[m % N], with results bitwise those of one device.
  // Evaluate, Logits and sampling use devices[0]. Not owned; same kind each.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const std::vector<Device*>& devices,
                                                         ModelConfig config,
                                                         const TrainerOptions& options);
  ~Trainer();

  // Parameters: normal(0, 0.02) for weight matrices, 1 for norms, 0 for biases,
  // from a generator fully determined by `seed`. With the master on NVMe a
  // write error is kept and returned by the next Step and UpdateStatus.
  void InitializeRandom(uint64_t seed);
  // `inputs`: the daemon's checked descriptors (hf_loader.h); null reads by path.
  absl::Status LoadHfWeights(const std::string& dir, const InputFiles* inputs = nullptr);

  // One optimizer step over `micro_batches` (each micro_batch_size x seq_len
  // inputs and targets; negative target = ignored).
  // `layouts`: one per micro-batch for packed samples (positions and segment ids, see
  // streaming_executor.h TokenLayout), or empty for plain windows. A step whose targets are all
  // ignored runs nothing and updates nothing: it reports loss 0, valid_tokens 0 and
  // no_counted_targets (a micro-batch with none among others contributes exactly zero).
  absl::StatusOr<StepReport> Step(const std::vector<const int32_t*>& inputs,
                                  const std::vector<const int32_t*>& targets,
                                  const std::vector<TokenLayout>& layouts = {});

  // Mean loss over the valid targets of the given micro-batches, forward only,
  // with the parameters after the last step.
  absl::StatusOr<double> Evaluate(const std::vector<const int32_t*>& inputs,
                                  const std::vector<const int32_t*>& targets,
                                  const std::vector<TokenLayout>& layouts = {});

  // Logits [micro_batch_size * seq_len, vocab] of one micro-batch of inputs
  // with the parameters after the last step.
  absl::StatusOr<std::vector<float>> Logits(const int32_t* inputs);

  // Waits until the last step's optimizer update has finished writing.
  void WaitForUpdates();
  // WaitForUpdates, then the update's outcome (an NVMe I/O error, say), or
  // that of the last InitializeRandom.
  absl::Status UpdateStatus() override;

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  const ParameterStore& store() const { return store_; }
  ParameterStore& mutable_store() { return store_; }
  const StreamingExecutor& executor() const { return *executor_; }  // device 0's
  // The devices' reduce-scatter (GradientReduction::kDevices), or null.
  const DeviceReduction* device_reduction() const { return device_reduction_.get(); }
  // Whether device_reduction() runs among the ranks of a data-parallel job (one device each)
  // rather than among this process's devices.
  bool reduces_across_ranks() const { return reduce_scatter_across_ranks_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  // The tier table of the placement (empty without budgets).
  const std::string& placement_table() const { return placement_table_; }
  uint64_t steps_done() const { return step_; }

  // After WaitForUpdates: the optimizer position and, through mutable_store(),
  // every entry's master, m and v. RestoreProgress is for resume, after the
  // store's buffers have been filled from a checkpoint.
  TrainerProgress progress() const;
  void RestoreProgress(const TrainerProgress& progress);

  // Snapshot protocol, for writing a checkpoint while training continues:
  // after WaitForUpdates, BeginSnapshot freezes the current parameters in the
  // sense that no optimizer update touches entry e (master, m, v) until
  // SnapshotEntryDone(e) or EndSnapshot. Forward and backward only read the
  // compute copy (by default the master itself on the CPU device), so the
  // next steps run alongside the writer; their updates wait. With the
  // optimizer state on NVMe, AsyncCheckpointWriter writes synchronously.
  void BeginSnapshot();
  void SnapshotEntryDone(int entry);
  void EndSnapshot();
  // Copies a tensor's fp32 master values (after WaitForUpdates), wherever the
  // master lives.
  absl::StatusOr<std::vector<float>> ReadTensor(const std::string& hf_name);
  // The last step's accumulated gradient of a tensor, before clipping.
  absl::StatusOr<std::vector<float>> ReadGradient(const std::string& hf_name);

 private:
  // update_status_ as the next Step reports it: "optimizer update of step N failed: ...".
  absl::Status PreviousUpdateFailure() const;
  Trainer(Device& device, ModelConfig config, ParameterLayout layout, ParameterStore store,
          const TrainerOptions& options, kernels::cpu::RopeTable rope);
  absl::StatusOr<std::vector<float>> ReadSlab(const std::string& hf_name, bool gradient);
  // Per entry, where new master values are written before WriteMasters
  // (ParameterStore::MasterScratch); only when every entry has one.
  std::vector<float*> MasterDestinations();
  // Draws entry e's initial master into `master` (entry elements floats).
  void FillRandomEntry(uint64_t seed, int e, float* master);
  // With the master on NVMe: writes every entry's master from the last
  // MasterDestinations through the store, then zeroes gradient slabs used as
  // scratch; else refreshes the compute copy from the RAM masters.
  absl::Status WriteMasters();
  std::vector<float*> master_destinations_;
  tiers::NvmeStateStoreStats nvme_reported_;  // NVMe totals at the last StepReport
  // AdamW over entry e (chunk by chunk where the state or gradient is on NVMe).
  // `speculative`: read the current state, write the new master, m and v to the alternates:
  // regions of the state file for those on NVMe, arrays for those in RAM (the compute copy as
  // usual, in place).
  absl::Status UpdateEntry(int e, const kernels::AdamwStepScalars& decay,
                           const kernels::AdamwStepScalars& no_decay, bool speculative = false);
  // `committed`: per entry, a speculative update that is this step's (empty = none): the
  // pass commits those and updates the others.
  void LaunchUpdate(uint64_t version, double clip_coefficient, double lr,
                    std::vector<bool> committed = {});
  // Speculative update (trainer_speculation.cc). Begin: before the step's micro-batches.
  // Discard: undoes what a speculation wrote outside the alternate regions (the compute copy)
  // when no update pass follows. Commit: the alternate regions of entry e become current.
  // `planned_coefficient`: the previous-norm rule's plan, the clip coefficient the speculation
  // updates with; 0 (none): it updates with 1.
  void BeginSpeculation(uint64_t weights_version, double planned_coefficient);
  absl::Status DiscardSpeculation(const SpeculativeUpdate::Outcome& outcome);
  void CommitSpeculated(int e);
  // The RAM form's commit: each updated entry's alternate master, m and v (the mixed form: the
  // master; CommitSpeculated flips m's and v's regions) become current
  // (ParameterStore::SwapAlternateState), once a checkpoint being written is done with it. On
  // the trainer's thread before the update pass is launched: the next step's weight copies read
  // the master pointers when they are enqueued, which may be before that pass publishes them.
  void CommitSpeculatedInRam(const std::vector<bool>& updated);
  // Where AdamW writes entry e's new master, m and v from element `first` on: in place, or
  // into `alternate` (ParameterStore::alternate) when it has arrays (a speculative update of a
  // state in RAM; in the mixed form it has the master's only, and m and v stay in place in the
  // staging, bound for the alternate regions).
  static AdamwArrays UpdateTargets(float* master, float* m, float* v,
                                   const EntryBuffers& alternate, size_t first);
  // A step whose targets are all ignored (`tokens` inputs): no compute, no update.
  absl::StatusOr<StepReport> EmptyStep(int64_t tokens);

  Device& device_;
  ModelConfig config_;
  ParameterLayout layout_;
  ParameterStore store_;
  TrainerOptions options_;
  kernels::cpu::RopeTable rope_;
  ModelDims dims_;
  UpdateGate gate_;
  ThreadPool optimizer_pool_;
  ThreadPool compute_pool_;  // parallel loops of the compute stream (attention)
  HostAdamw adamw_;
  // GradientReduction::kDevices: the devices' reduce-scatter (null otherwise); the executors hold
  // it, so it is declared before them and outlives them.
  std::unique_ptr<DeviceReduction> device_reduction_;
  // The device_reduction_ is among the ranks (one device each): after the micro-batches each
  // rank's slabs hold its shard of the reduced entries (GatherReducedGradients).
  bool reduce_scatter_across_ranks_ = false;
  // Set by a step that failed with reduce_scatter_across_ranks_: every later Step returns it.
  absl::Status ranks_out_of_step_;
  std::unique_ptr<StreamingExecutor> executor_;  // device 0's
  // Every device (device_ first), and for the others their compute pools and
  // executors (multi_device_step.h); the pools outlive the executors.
  std::vector<Device*> devices_;
  std::vector<std::unique_ptr<ThreadPool>> lane_compute_pools_;
  std::vector<std::unique_ptr<StreamingExecutor>> lane_executors_;
  GradientTurns turns_;
  // Each device with its executor, device 0 first.
  std::vector<DeviceLane> Lanes() const;
  std::thread update_thread_;
  absl::Status update_status_;  // written by the update thread, read after joining it
  absl::Status init_status_;    // of the last InitializeRandom (NVMe master writes)
  absl::Mutex snapshot_mu_;
  bool snapshot_active_ ABSL_GUARDED_BY(snapshot_mu_) = false;
  std::vector<bool> snapshot_done_ ABSL_GUARDED_BY(snapshot_mu_);
  std::string placement_table_;
  std::vector<double> update_seconds_;  // per entry, written by the update thread
  // ZeRO-1: which rank owns which elements of each entry; world() 0 when off.
  Zero1Shards zero1_shards_;
  uint64_t step_ = 0;                   // optimizer steps attempted
  uint64_t applied_updates_ = 0;        // steps whose update ran (AdamW's t)
  double previous_grad_norm_ = 0;       // of the last step that updated; 0 = none yet
  int consecutive_skips_ = 0;
  uint64_t skipped_steps_ = 0;
  double speculation_seconds_ = 0;  // of the running speculation, written by its thread
  // Null when the speculative update is off. Last: its thread uses the members above.
  std::unique_ptr<SpeculativeUpdate> speculation_;
};

}  // namespace megatrain::engine
