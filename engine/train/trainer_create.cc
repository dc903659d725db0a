// Trainer::Create: checks the options, places the store's arrays in the memory tiers, chooses
// where several devices' gradients meet (gradient_reduction.h), and builds one executor per
// device over the one store.
#include <cblas.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/exec/cpu_device_reduction.h"
#include "engine/exec/executor_geometry.h"
#include "engine/train/data_parallel_step.h"
#include "engine/train/trainer.h"

namespace megatrain::engine {

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(Device& device, ModelConfig config,
                                                         const TrainerOptions& options) {
  return Create(std::vector<Device*>{&device}, std::move(config), options);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const std::vector<Device*>& devices,
                                                         ModelConfig config,
                                                         const TrainerOptions& options) {
  if (absl::Status s = CheckTrainerDevices(devices); !s.ok()) return s;
  Device& device = *devices[0];
  ExecutorOptions executor_options = options.executor;
  // Creating several CUDA devices leaves the last one current; the store and executor 0 are 0's.
  if (absl::Status s = device.MakeCurrent(); !s.ok()) return s;
  if (options.micro_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch_size=", options.micro_batch_size, " must be >= 1"));
  }
  if (options.seq_len < 1 || options.seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len=", options.seq_len,
        " must be in [1, max_position_embeddings=", config.max_position_embeddings, "]"));
  }
  if (absl::Status s = config.CheckSequenceLength(options.seq_len); !s.ok()) return s;
  for (auto [name, value] : {std::pair{"beta1", options.beta1}, {"beta2", options.beta2}}) {
    if (!(value >= 0 && value < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(name, "=", value, " must be in [0, 1)"));
    }
  }
  if (!(options.eps > 0) || !std::isfinite(options.eps)) {
    return absl::InvalidArgumentError(absl::StrCat("eps=", options.eps, " must be positive"));
  }
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay=", options.weight_decay, " must be >= 0"));
  }
  if (!(options.grad_clip >= 0) || !std::isfinite(options.grad_clip)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_clip=", options.grad_clip, " must be >= 0"));
  }
  if (absl::Status s = ValidateLrSchedule(options.lr); !s.ok()) return s;
  if (!(options.grad_clip_headroom >= 1) || !std::isfinite(options.grad_clip_headroom)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_clip_headroom=", options.grad_clip_headroom, " must be finite and >= 1"));
  }
  if (options.grad_clip_rule == GradClipRule::kPreviousNorm && options.grad_clip == 0) {
    return absl::InvalidArgumentError(
        "grad_clip_rule=previous_norm needs a clip (grad_clip > 0; 0 turns clipping off)");
  }
  if (options.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective_timeout=", absl::FormatDuration(options.collective_timeout),
                     " must be positive (InfiniteDuration: no deadline)"));
  }

  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  if (!layout.ok()) return layout.status();
  std::vector<EntrySpec> specs;
  for (const LayoutEntry& entry : layout->entries()) {
    EntrySpec spec;
    spec.elements = entry.num_elements;
    for (const TensorSlot& t : entry.tensors) {
      spec.segments.push_back(AdamwSegment{t.offset, t.num_elements(), t.weight_decay});
    }
    specs.push_back(std::move(spec));
  }
  // Data parallelism over MPI with a tied embedding: the rows' gradient is kept apart from the LM
  // head's in a second array of the embedding's size, so the ranks' reduction adds the two in one
  // process's order (docs/scale_out.md); counted with the gradients in the memory plan.
  const bool rows_gradient_apart = options.communicator != nullptr &&
                                   options.communicator->size() > 1 && layout->tied_embeddings();
  StorePlacement store_placement;
  if (rows_gradient_apart) store_placement.rows_gradient_entry = layout->embedding_entry();
  // A GPU computes from a bf16 copy the optimizer keeps beside the master.
  store_placement.compute_copy_bf16 = device.kind() == DeviceKind::kCuda;
  if ((options.memory.master_on_nvme || options.memory.grad_on_nvme ||
       options.memory.compute_copy_on_nvme) &&
      !options.memory.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.memory.master_on_nvme  ? "memory.master_on_nvme"
        : options.memory.grad_on_nvme ? "memory.grad_on_nvme"
                                      : "memory.compute_copy_on_nvme",
        " needs memory budgets with an nvme_dir (memory.enabled)"));
  }
  absl::StatusOr<ExecutorGeometry> geometry =
      MakeExecutorGeometry(config, *layout, options.micro_batch_size, options.seq_len,
                           options.head_chunk, options.head_block_rows);
  if (!geometry.ok()) return geometry.status();
  // Several devices either reduce-scatter their own sums among themselves, or take turns on the
  // store's slabs in micro-batch order (their gradients summed on the host: auto accumulation
  // becomes host, device is refused here, not at the first step).
  std::unique_ptr<DeviceReduction> device_reduction;
  const auto turns_on_the_host = [&]() -> absl::Status {
    device_reduction.reset();
    executor_options.device_reduction = nullptr;
    executor_options.reduce_every_micro_batch = false;
    absl::StatusOr<GradientAccumulation> accumulation = GradientAccumulationForRun(
        options.executor.gradient_accumulation, /*micro_batches_per_device=*/2,
        static_cast<int>(devices.size()));
    if (!accumulation.ok()) return accumulation.status();
    executor_options.gradient_accumulation = *accumulation;
    return absl::OkStatus();
  };
  // One device per rank of a data-parallel job: its reduce-scatter may run among the ranks
  // instead (asked for by name; auto keeps the host's reduction across processes).
  const bool across_ranks = devices.size() == 1 && options.communicator != nullptr &&
                            options.communicator->size() > 1;
  const bool ranks_asked = across_ranks &&
                           (options.gradient_reduction == GradientReduction::kDevices ||
                            options.gradient_reduction == GradientReduction::kDeviceShards);
  if (options.communicator != nullptr && options.communicator->size() > 1) {
    // Making a reduction among the ranks may be a collective (NCCL's world formed over the
    // host): first every rank agrees that all will make the same one (and, under ZeRO-1, cut
    // the same shards), or all fail here naming the rank that differs, rather than meeting
    // another rank's collective with this one.
    if (absl::Status s = CheckSameJob(
            *options.communicator,
            absl::StrCat("gradient_reduction ",
                         std::string(GradientReductionName(options.gradient_reduction)),
                         " devices ", devices.size(), " kind ",
                         std::string(DeviceKindName(device.kind())), " zero1 ", options.zero1,
                         // ZeRO-1's shards are the store's chunks: ranks whose chunks differ
                         // would call the owners' collectives with different counts.
                         options.zero1
                             ? absl::StrCat(" chunk bytes ", options.memory.nvme_chunk_bytes)
                             : std::string()));
        !s.ok()) {
      return s;
    }
  }
  if (devices.size() > 1 || ranks_asked) {
    GradientReductionInputs in;
    in.asked = options.gradient_reduction;
    in.accumulation = options.executor.gradient_accumulation;
    in.devices = across_ranks ? options.communicator->size() : static_cast<int>(devices.size());
    in.across_ranks = across_ranks;
    in.kind = device.kind();
    in.tied_embeddings = layout->tied_embeddings();
    in.grad_on_nvme = options.memory.enabled && options.memory.grad_on_nvme;
    in.weight_ring = options.executor.weight_ring_bytes > 0;
    std::vector<size_t> entry_elements;
    for (const EntrySpec& spec : specs) entry_elements.push_back(spec.elements);
    // As auto accumulation decides: on CUDA, the sums (whole, or this device's shards) beside the
    // minimum plan. A world of the job's size for the plan's padding and shards only.
    CpuDeviceReduction planning_world(in.devices);
    for (bool shards : {false, true}) {
      ExecutorOptions probe = options.executor;
      probe.gradient_accumulation = GradientAccumulation::kAuto;
      probe.device_reduction = &planning_world;
      probe.reduce_every_micro_batch = shards;
      (shards ? in.shard_sums_fit : in.sums_fit) =
          StreamingExecutor::ResolveGradientAccumulation(geometry->dims, geometry->layout,
                                                         entry_elements, probe,
                                                         device.arena_stats().capacity,
                                                         device.kind()) ==
          GradientAccumulation::kDevice;
    }
    absl::StatusOr<GradientReduction> reduction = ReduceOnDevices(in);
    if (!reduction.ok()) return reduction.status();
    const bool reduce = *reduction != GradientReduction::kHost;
    absl::StatusOr<std::unique_ptr<DeviceReduction>> made = std::unique_ptr<DeviceReduction>();
    if (reduce && across_ranks) {
      made = MakeRankReduction(device, *options.communicator, options.zero1,
                               options.collective_timeout);
    } else if (reduce) {
      made = MakeDeviceReduction(devices, options.collective_timeout);
    }
    if (reduce && made.ok()) {
      device_reduction = std::move(*made);
      executor_options.gradient_accumulation = GradientAccumulation::kDevice;
      executor_options.device_reduction = device_reduction.get();
      executor_options.reduce_every_micro_batch = *reduction == GradientReduction::kDeviceShards;
      if (across_ranks) executor_options.reduction_rank = options.communicator->rank();
    } else if (reduce && options.gradient_reduction != GradientReduction::kAuto) {
      return made.status();
    } else {
      // Auto falls back to the turns where the reduction cannot be made (NCCL missing, say).
      if (absl::Status s = turns_on_the_host(); !s.ok()) return s;
    }
  }
  Zero1Shards zero1_shards;
  if (options.zero1) {
    if (options.communicator == nullptr) {
      return absl::InvalidArgumentError("zero1 needs a communicator (data parallelism)");
    }
    // The shards are whole chunks of the store (ParameterStore::chunks), whatever the tiers.
    store_placement.nvme_chunk_bytes = options.memory.nvme_chunk_bytes;
    if (store_placement.nvme_chunk_bytes == 0 ||
        store_placement.nvme_chunk_bytes % tiers::kNvmeChunkQuantumBytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory.nvme_chunk_bytes=", store_placement.nvme_chunk_bytes,
          " must be a positive multiple of ", tiers::kNvmeChunkQuantumBytes, " (256 KiB)"));
    }
    std::vector<size_t> elements;
    for (const EntrySpec& spec : specs) elements.push_back(spec.elements);
    zero1_shards =
        Zero1Shards(EntryChunks(elements, store_placement.nvme_chunk_bytes / sizeof(float)),
                    options.communicator->size());
    // The placement counts only this rank's m and v (RAM or its NVMe file).
    store_placement.optimizer_state_ranges = zero1_shards.ranges_of(options.communicator->rank());
  }
  std::string placement_table;
  if (options.memory.enabled) {
    std::vector<tiers::EntryBytes> bytes;
    for (const EntrySpec& spec : specs) {
      tiers::EntryBytes b;
      b.grad_stays_in_ram = bytes.size() == static_cast<size_t>(layout->embedding_entry());
      b.compute_copy_stays_in_ram = b.grad_stays_in_ram;  // gathered by rows on the host
      const uint64_t n = spec.elements * sizeof(float);
      b[tiers::BufferKind::kMaster] = n;
      const uint64_t owned =
          store_placement.optimizer_state_ranges.empty()
              ? n
              : store_placement.optimizer_state_ranges[bytes.size()].count * sizeof(float);
      b[tiers::BufferKind::kM] = owned;
      b[tiers::BufferKind::kV] = owned;
      // The embedding's gradient (which stays in RAM) and its rows' gradient apart, if any.
      b[tiers::BufferKind::kGrad] = b.grad_stays_in_ram && rows_gradient_apart ? 2 * n : n;
      // The CPU device computes from the master (or, with the master on NVMe,
      // an fp32 copy PlanPlacement adds); a GPU from a bf16 copy.
      b[tiers::BufferKind::kComputeCopy] = store_placement.compute_copy_bf16 ? n / 2 : 0;
      bytes.push_back(b);
    }
    tiers::PlacementOptions placement_options;
    placement_options.states_on_nvme = options.memory.states_on_nvme;
    placement_options.master_on_nvme = options.memory.master_on_nvme;
    placement_options.grad_on_nvme = options.memory.grad_on_nvme;
    placement_options.compute_copy_on_nvme = options.memory.compute_copy_on_nvme;
    placement_options.chunk_bytes = options.memory.nvme_chunk_bytes;
    placement_options.speculative_update =
        options.speculative_update && options.communicator == nullptr && !options.zero1;
    placement_options.staging_slots =
        store_placement.read_ahead + 1 + store_placement.max_writes_in_flight;
    // Every device's executor allocates its pinned staging from the same budget: set it aside
    // first (its checkpoint count depends on the arena only), so the store yields to it.
    placement_options.pinned_reserved =
        ExecutorPinnedStagingBytes(*geometry, executor_options, device.arena_stats().capacity,
                                   device.kind(), static_cast<int>(devices.size()));
    absl::StatusOr<tiers::Placement> placement =
        tiers::PlanPlacement(bytes, options.memory.budgets, placement_options);
    if (!placement.ok()) return placement.status();
    if (options.speculative_update) {
      if (options.communicator != nullptr || options.zero1) {
        placement->speculation_note =
            "speculative update off: data parallelism reduces gradients after all micro-batches";
      } else {
        const bool on = tiers::ReserveAlternateStateRegions(*placement);
        store_placement.alternate_state_regions = on && placement->alternate_state_bytes > 0;
        store_placement.alternate_ram_state = on && placement->alternate_ram_bytes > 0;
      }
    }
    store_placement.master_pinned =
        placement->tier(tiers::BufferKind::kMaster) == tiers::Tier::kPinned;
    store_placement.grad_pinned = placement->tier(tiers::BufferKind::kGrad) == tiers::Tier::kPinned;
    store_placement.states_on_nvme = placement->tier(tiers::BufferKind::kM) == tiers::Tier::kNvme;
    store_placement.master_on_nvme =
        placement->tier(tiers::BufferKind::kMaster) == tiers::Tier::kNvme;
    store_placement.compute_copy_fp32 = placement->compute_copy_fp32;
    store_placement.grad_on_nvme = placement->tier(tiers::BufferKind::kGrad) == tiers::Tier::kNvme;
    // The placement's per-entry answer: the embedding's and the entries the RAM left over holds.
    store_placement.grad_ram_entries = placement->grad_ram_entries;
    store_placement.compute_copy_on_nvme =
        placement->tier(tiers::BufferKind::kComputeCopy) == tiers::Tier::kNvme;
    store_placement.compute_copy_ram_entries = {layout->embedding_entry()};
    store_placement.compute_copy_pinned =
        placement->tier(tiers::BufferKind::kComputeCopy) == tiers::Tier::kPinned ||
        placement->tier(tiers::BufferKind::kComputeCopy) == tiers::Tier::kAbsent;
    store_placement.nvme_chunk_bytes = options.memory.nvme_chunk_bytes;
    store_placement.nvme_dir = options.memory.budgets.nvme_dir;
    store_placement.block_io = options.memory.block_io_for_tests;
    placement_table = placement->Table();
  } else if (options.speculative_update && options.communicator == nullptr && !options.zero1) {
    // No budgets: everything in RAM, nothing to count the alternates against.
    store_placement.alternate_ram_state = true;
  }
  // The placement may have put gradients on NVMe by itself (RAM short), whose chunks take whole
  // contributions in turns: auto goes back to the turns, devices is refused naming the cause.
  if (device_reduction != nullptr && store_placement.grad_on_nvme) {
    if (options.gradient_reduction == GradientReduction::kAuto) {
      if (absl::Status s = turns_on_the_host(); !s.ok()) return s;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient_reduction=", std::string(GradientReductionName(options.gradient_reduction)),
          across_ranks ? absl::StrCat(" across ", options.communicator->size(), " ranks")
                       : absl::StrCat(" with devices=", devices.size()),
          ": the memory placement puts the gradients on NVMe (memory.grad_on_nvme, or a RAM "
          "budget too small for them), whose chunks take whole contributions in turns; give "
          "them RAM or use host"));
    }
  }
  if (absl::Status s = CheckMultiDevicePlacement(static_cast<int>(devices.size()), store_placement);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<ParameterStore> store =
      ParameterStore::Create(device, std::move(specs), store_placement);
  if (!store.ok()) return store.status();
  absl::StatusOr<kernels::cpu::RopeTable> rope = kernels::cpu::RopeTable::Create(
      options.seq_len, config.head_dim, config.rope_theta, config.KernelRopeScaling());
  if (!rope.ok()) return rope.status();

  openblas_set_num_threads(std::max(1, options.blas_threads));

  auto trainer = std::unique_ptr<Trainer>(new Trainer(
      device, std::move(config), std::move(*layout), std::move(*store), options, std::move(*rope)));
  trainer->dims_ = geometry->dims;
  trainer->reduce_scatter_across_ranks_ = across_ranks && device_reduction != nullptr;
  trainer->device_reduction_ = std::move(device_reduction);
  trainer->zero1_shards_ = std::move(zero1_shards);
  absl::StatusOr<std::unique_ptr<StreamingExecutor>> executor = StreamingExecutor::Create(
      device, geometry->dims, geometry->layout, trainer->store_, trainer->gate_, trainer->rope_,
      executor_options, &trainer->compute_pool_);
  if (!executor.ok()) return executor.status();
  trainer->executor_ = std::move(*executor);
  trainer->devices_ = devices;
  for (size_t d = 1; d < devices.size(); ++d) {
    // CUDA: the executor's streams, cuBLAS handles and buffers belong to the current device.
    if (absl::Status s = devices[d]->MakeCurrent(); !s.ok()) return s;
    trainer->lane_compute_pools_.push_back(
        std::make_unique<ThreadPool>(static_cast<size_t>(std::max(1, options.blas_threads))));
    ExecutorOptions lane_options = executor_options;
    lane_options.reduction_rank = static_cast<int>(d);
    absl::StatusOr<std::unique_ptr<StreamingExecutor>> lane = StreamingExecutor::Create(
        *devices[d], geometry->dims, geometry->layout, trainer->store_, trainer->gate_,
        trainer->rope_, lane_options, trainer->lane_compute_pools_.back().get());
    if (!lane.ok()) {
      return absl::Status(lane.status().code(),
                          absl::StrCat("device ", d, ": ", lane.status().message()));
    }
    trainer->lane_executors_.push_back(std::move(*lane));
  }
  // Evaluation, logits and sampling run on device 0 from the caller's thread.
  if (absl::Status s = devices[0]->MakeCurrent(); !s.ok()) return s;
  trainer->placement_table_ = std::move(placement_table);
  if (store_placement.alternate_state_regions || store_placement.alternate_ram_state) {
    trainer->speculation_ = std::make_unique<SpeculativeUpdate>(trainer->store_.num_entries());
  }
  return trainer;
}

}  // namespace megatrain::engine
