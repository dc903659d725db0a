// Plan(): layout -> placement -> executor plan -> step-time replay; and the largest-fit search.
#include "engine/planner/planner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/exec/zero1_shards.h"
#include "engine/model/parameter_layout.h"
#include "engine/planner/executor_geometry.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine::planner {
namespace {

using tiers::BufferKind;

constexpr uint64_t kUnlimited = uint64_t{1} << 62;

}  // namespace

namespace {

// The activation policy fed with the profile: its link both ways and one
// layer's forward and backward compute from the step-time model.
ActivationDecision PredictActivationModes(const ExecutorGeometry& g, const ExecutorOptions& options,
                                          int activation_sets, int weight_slots,
                                          const HardwareProfile& hw, double flop_parameters) {
  const ScheduleShape& shape = g.layout.schedule;
  ActivationCosts costs;
  costs.num_layers = shape.num_layers;
  costs.checkpoint_interval = options.keep_all ? shape.num_layers : options.checkpoint_interval;
  const int working = std::min(costs.checkpoint_interval, shape.num_layers);
  costs.keep_capacity_blocks =
      options.keep_all ? 0 : (activation_sets - working) / std::max(1, costs.checkpoint_interval);
  if (shape.num_layers > 0) {
    const double elements = static_cast<double>(g.entry_elements[shape.first_layer_entry]);
    costs.weight_bytes = elements * hw.weight_bytes;
    costs.gradient_bytes = elements * hw.grad_bytes;
  }
  const DeviceKind kind = hw.cpu_device ? DeviceKind::kCpu : DeviceKind::kCuda;
  costs.activation_set_bytes =
      static_cast<double>(StreamingExecutor::SizesFor(kind, g.dims).activation_set_bytes);
  ActivationMeasurement m;
  const double memcpy_gbps = hw.memcpy_gbps > 0 ? hw.memcpy_gbps : 0;
  m.copy_in_bytes_per_second = (hw.h2d_gbps > 0 ? hw.h2d_gbps : memcpy_gbps) * 1e9;
  m.copy_out_bytes_per_second = (hw.d2h_gbps > 0 ? hw.d2h_gbps : memcpy_gbps) * 1e9;
  ExecutorOptions plain = options;
  plain.block_modes.clear();
  const StepWork work = BuildStepWork(g, plain, weight_slots, 1, hw, flop_parameters);
  for (const OpWork& o : work.ops) {
    if (o.op.kind == StageKind::kLayerForward && m.forward_seconds == 0) {
      m.forward_seconds = OpComputeSeconds(o, hw);
    }
    if (o.op.kind == StageKind::kLayerBackward && m.backward_seconds == 0) {
      m.backward_seconds = OpComputeSeconds(o, hw);
    }
  }
  return DecideActivationModes(options.activation_policy, costs, m);
}

}  // namespace

absl::StatusOr<PlanResult> Plan(const ModelConfig& config, const PlanInputs& in,
                                const HardwareProfile& hw) {
  if (in.grad_accumulation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_accumulation=", in.grad_accumulation, " must be >= 1"));
  }
  if (in.weight_slots == 1 || in.weight_slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_slots=", in.weight_slots, " must be 0 (auto) or >= 2"));
  }
  if (!std::isfinite(in.weight_ring_layers) || in.weight_ring_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_ring_layers=", in.weight_ring_layers, " must be >= 0"));
  }
  if (in.weight_ring_layers > 0 && in.weight_ring_bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_ring_layers=", in.weight_ring_layers, " and weight_ring_bytes=",
                     in.weight_ring_bytes, ": give the ring in layers or in bytes, not both"));
  }
  if (in.fragment_bytes > 0 && in.weight_ring_layers == 0 && in.weight_ring_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("fragment_bytes=", in.fragment_bytes,
                                                   " needs a weight ring (weight_ring_bytes or "
                                                   "weight_ring_layers)"));
  }
  if (in.drive_wear.enabled()) {
    if (absl::Status s = ValidateDriveWearLimit(in.drive_wear); !s.ok()) return s;
  }
  if (absl::Status s = config.CheckSequenceLength(in.seq); !s.ok()) return s;
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  if (!layout.ok()) return layout.status();

  PlanResult r;
  r.hardware = hw.name;
  r.parameters = layout->parameter_count();
  r.tied_embeddings = layout->tied_embeddings();
  r.padded_elements = layout->padded_element_count();

  // ZeRO-1: the rank holding the most elements of m and v (the shares differ by a chunk at
  // most), whose per-entry ranges the Trainer would count.
  std::vector<size_t> zero1_owned;
  if (in.zero1_world > 1) {
    std::vector<size_t> elements;
    for (const LayoutEntry& e : layout->entries()) elements.push_back(e.num_elements);
    const size_t chunk_elements = std::max<size_t>(1, in.nvme_chunk_bytes / sizeof(float));
    const Zero1Shards shards(EntryChunks(elements, chunk_elements), in.zero1_world);
    size_t most = 0;
    for (int rank = 0; rank < in.zero1_world; ++rank) {
      std::vector<size_t> owned;
      size_t total = 0;
      for (const ElementRange& r : shards.ranges_of(rank)) {
        owned.push_back(r.count);
        total += r.count;
      }
      if (zero1_owned.empty() || total > most) {
        most = total;
        zero1_owned = std::move(owned);
      }
    }
  }
  // Tiers: the same EntryBytes the Trainer hands to PlanPlacement.
  std::vector<tiers::EntryBytes> bytes;
  uint64_t endpoint_bytes = 0, total_bytes = 0;
  for (const LayoutEntry& e : layout->entries()) {
    tiers::EntryBytes b;
    b.grad_stays_in_ram = bytes.size() == static_cast<size_t>(layout->embedding_entry());
    b.compute_copy_stays_in_ram = b.grad_stays_in_ram;
    const uint64_t n = e.num_elements * sizeof(float);
    b[BufferKind::kMaster] = n;
    const uint64_t state = zero1_owned.empty() ? n : zero1_owned[bytes.size()] * sizeof(float);
    b[BufferKind::kM] = state;
    b[BufferKind::kV] = state;
    // A tied embedding's rows' gradient kept apart across ranks (trainer_create.cc).
    b[BufferKind::kGrad] =
        b.grad_stays_in_ram && in.ranks > 1 && layout->tied_embeddings() ? 2 * n : n;
    b[BufferKind::kComputeCopy] = hw.cpu_device ? 0 : e.num_elements * hw.weight_bytes;
    endpoint_bytes += b[BufferKind::kGrad] +
                      (hw.cpu_device ? b[BufferKind::kMaster] : b[BufferKind::kComputeCopy]);
    for (uint64_t x : b.bytes) total_bytes += x;
    bytes.push_back(b);
  }

  // Device.
  r.executor.checkpoint_interval = in.checkpoint_interval;
  r.executor.keep_all = in.keep_all;
  r.executor.device_checkpoints = in.device_checkpoints;
  r.executor.weight_slots = in.weight_slots;
  r.executor.activation_budget_bytes = in.activation_budget_bytes;
  r.executor.activation_policy = in.activation_policy;
  absl::StatusOr<GradientAccumulation> accumulation = GradientAccumulationForRun(
      in.gradient_accumulation, in.grad_accumulation / std::max(1, in.devices), in.devices);
  if (!accumulation.ok()) return accumulation.status();
  r.executor.gradient_accumulation = *accumulation;
  r.asked_gradient_accumulation = in.gradient_accumulation;
  absl::StatusOr<ExecutorGeometry> g =
      MakeExecutorGeometry(config, *layout, in.micro_batch, in.seq, in.head_chunk, r.executor,
                           in.head_block_rows);
  if (!g.ok()) return g.status();
  r.device_arena_capacity =
      in.device_arena_bytes > 0 ? in.device_arena_bytes : hw.device_memory_bytes;
  // A GPU profile is planned with the CUDA backend's own sizes (bf16 weights
  // and activations, fp32 gradients), exactly as the executor would allocate.
  const DeviceKind kind = hw.cpu_device ? DeviceKind::kCpu : DeviceKind::kCuda;
  r.layer_ring_bytes = StreamingExecutor::LayerRingBytes(g->dims, g->layout.layer_offsets, kind);
  r.executor.weight_ring_bytes =
      in.weight_ring_layers > 0
          ? static_cast<size_t>(std::ceil(in.weight_ring_layers * r.layer_ring_bytes))
          : in.weight_ring_bytes;
  r.executor.fragment_bytes = in.fragment_bytes;
  if (r.executor.weight_ring_bytes > 0) {
    // The executor's own fragment plan: a ring it would refuse is refused here, in its words.
    absl::StatusOr<FragmentPlan> fragments = StepFragmentPlanFor(*g, r.executor, kind);
    if (!fragments.ok()) return fragments.status();
    r.step_fragments = static_cast<int>(fragments->fragments.size());
  }
  // Auto checkpoints (and where gradients are summed) resolved as Create resolves them;
  // everything below (slots, pinned staging, the step's copies) uses them.
  r.executor.gradient_accumulation = StreamingExecutor::ResolveGradientAccumulation(
      g->dims, g->layout, g->entry_elements, r.executor, r.device_arena_capacity, kind);
  r.executor.device_checkpoints =
      DeviceCheckpointsFor(*g, r.executor, r.device_arena_capacity, kind);
  r.weight_slots = WeightSlotsFor(*g, r.executor, r.device_arena_capacity, kind);
  r.device = DeviceMemoryPlanFor(*g, r.executor, r.weight_slots, kind);
  absl::StatusOr<int> activation_sets =
      StreamingExecutor::ActivationSetsFor(g->dims, g->layout, r.executor, kind);
  if (!activation_sets.ok()) return activation_sets.status();
  r.device_arena_peak = r.device.total();
  r.fits_device = r.device_arena_peak <= r.device_arena_capacity;

  // Host peak.
  // The executor's own pinned staging, in the backend's element sizes: per device, and what
  // all the devices' executors take from the pinned budget.
  r.host_pinned_staging =
      ExecutorPinnedStagingBytes(*g, r.executor, r.device_arena_capacity, kind, /*devices=*/1);
  r.pinned_reserved =
      ExecutorPinnedStagingBytes(*g, r.executor, r.device_arena_capacity, kind, in.devices);

  // Tiers, after the executor's staging (the store's pinned buffers yield to it).
  tiers::TierBudgets budgets = in.budgets;
  if (!in.budgets_enabled) {
    budgets = tiers::TierBudgets{};
    budgets.pinned_ram = endpoint_bytes;
    // The speculative update of a state in RAM pins the master's alternate beside it where the
    // master is the copy endpoint (the CPU device).
    if (in.speculative_update && hw.cpu_device) {
      for (const tiers::EntryBytes& b : bytes) budgets.pinned_ram += b[BufferKind::kMaster];
    }
    budgets.ram = kUnlimited;
  }
  tiers::PlacementOptions placement_options;  // staging_slots = read_ahead 2 + 1 + writes 2
  placement_options.states_on_nvme = in.states_on_nvme;
  placement_options.master_on_nvme = in.master_on_nvme;
  placement_options.grad_on_nvme = in.grad_on_nvme;
  placement_options.compute_copy_on_nvme = in.compute_copy_on_nvme;
  placement_options.chunk_bytes = in.nvme_chunk_bytes;
  placement_options.speculative_update = in.speculative_update;
  // As the Trainer: with budgets, every device's executor staging is set aside from the pinned
  // budget before the store is placed (the auto checkpoint count, above, depends on the arena).
  if (in.budgets_enabled) placement_options.pinned_reserved = r.pinned_reserved;
  absl::StatusOr<tiers::Placement> placement =
      tiers::PlanPlacement(bytes, budgets, placement_options);
  if (!placement.ok()) return placement.status();
  const bool speculation_on =
      in.speculative_update && tiers::ReserveAlternateStateRegions(*placement);
  r.placement = *placement;
  if (!in.budgets_enabled) r.placement.budgets.ram = 0;  // "unset" in the table

  r.host_store_bytes = r.placement.pinned_used + r.placement.ram_used;
  r.nvme_bytes = r.placement.nvme_used;
  r.host_fixed_overhead = in.fixed_overhead_bytes;
  r.host_arena_bytes = hw.cpu_device ? r.device_arena_peak : 0;
  r.host_peak_bytes =
      r.host_store_bytes + r.pinned_reserved + r.host_fixed_overhead + r.host_arena_bytes;
  r.fits_host = !in.budgets_enabled ||
                r.host_store_bytes + r.pinned_reserved <= in.budgets.pinned_ram + in.budgets.ram;

  // Time. FLOP parameters: everything but the input embedding (a gather) unless it is tied.
  double flop_parameters = static_cast<double>(r.parameters);
  if (!config.tie_word_embeddings) {
    flop_parameters -= static_cast<double>(config.vocab_size * config.hidden_size);
  }
  r.activation =
      PredictActivationModes(*g, r.executor, *activation_sets, r.weight_slots, hw, flop_parameters);
  r.executor.block_modes = r.activation.modes();
  const StepWork work =
      BuildStepWork(*g, r.executor, r.weight_slots, in.grad_accumulation, hw, flop_parameters);
  // NVMe: exact bytes per step from the placement; per entry for the replay.
  r.nvme_traffic = NvmeTrafficPerStep(
      r.placement, in.grad_accumulation, in.keep_all ? 2 : 3,
      r.executor.gradient_accumulation == GradientAccumulation::kDevice);
  const NvmeEntryIo nvme_io = NvmeIoPerEntry(bytes, r.placement);
  StepWork timed = work;
  AddNvmeGradientTraffic(timed, nvme_io.gradient_bytes);
  AddNvmeWeightTraffic(timed, nvme_io.compute_copy_bytes);
  double weight_reads = 0;
  for (const OpWork& o : timed.ops) weight_reads += o.nvme_weight_bytes;
  if (r.nvme_traffic.weights_read_bytes > 0) {
    SetWeightReads(r.nvme_traffic, static_cast<uint64_t>(weight_reads));
  }
  // A speculation commits only when the step's clip coefficient is the one it ran with: 1 under
  // the exact rule, certain without clipping (with it, a step whose norm clips discards it and
  // runs the normal pass after it); the previous-norm rule's plan, which clipped steps apply
  // while it holds.
  r.speculation_credited = speculation_on && (in.grad_clip == 0 || in.previous_norm_clip);
  const std::string commits = in.grad_clip == 0
                                  ? "grad_clip 0: every step commits"
                                  : "the previous-norm clip rule: every step whose planned "
                                    "coefficient holds commits";
  timed.speculative_update = r.speculation_credited;
  if (r.speculation_credited) {
    const bool ram = r.placement.alternate_ram_bytes > 0;
    const bool nvme = r.placement.alternate_state_bytes > 0;
    r.speculation_note = absl::StrCat(
        ram && nvme
            ? "speculative update: the optimizer pass (m and v through NVMe into their alternate "
              "regions, the master into its alternate array in RAM) overlaps the last "
              "micro-batch's backward ("
        : ram ? "speculative update: the optimizer pass (host AdamW of the master, m and v in RAM, "
                "into alternate arrays; no NVMe traffic) overlaps the last micro-batch's backward ("
              : "speculative update: the optimizer pass overlaps the last micro-batch's backward (",
        commits, ")");
  } else if (speculation_on) {
    r.speculation_note = absl::StrCat(
        "speculative update: not credited in the step time: with grad_clip ", in.grad_clip,
        " a clipped step discards it and pays the normal optimizer pass after it (an unclipped "
        "step takes about the time planned with grad_clip 0)");
  } else if (in.speculative_update) {
    r.speculation_note = r.placement.speculation_note;
  }
  r.time = EstimateStepTime(timed, hw, nvme_io);
  r.tokens_per_step = work.tokens;
  r.work = std::move(timed);
  r.nvme_io = nvme_io;
  r.drive_wear_limit = in.drive_wear;
  r.drive_wear = EvaluateDriveWear(in.drive_wear, r.nvme_traffic.written_bytes, in.steps,
                                   std::isfinite(r.time.step_seconds) ? r.time.step_seconds : 0,
                                   in.ranks_per_machine);
  return r;
}

absl::StatusOr<LargestFit> LargestModelThatFits(const ModelConfig& family_template,
                                                const PlanInputs& inputs,
                                                const HardwareProfile& hw) {
  auto fits = [&](int layers) -> absl::StatusOr<PlanResult> {
    ModelConfig c = family_template;
    c.num_hidden_layers = layers;
    absl::StatusOr<PlanResult> p = Plan(c, inputs, hw);
    if (!p.ok()) return p.status();
    if (!p->fits_device) {
      return absl::ResourceExhaustedError(absl::StrCat("device plan ", p->device_arena_peak,
                                                       " bytes > ", p->device_arena_capacity));
    }
    if (!p->fits_host) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host store ", p->host_store_bytes, " + pinned staging ",
                       p->host_pinned_staging, " bytes > the pinned + RAM budgets"));
    }
    return p;
  };
  absl::StatusOr<PlanResult> one = fits(1);
  if (!one.ok()) {
    return absl::NotFoundError(
        absl::StrCat("not even one layer of this shape fits: ", one.status().message()));
  }
  int lo = 1, hi = 2;
  while (hi < (1 << 20) && fits(hi).ok()) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid).ok() ? lo : hi) = mid;
  }
  absl::StatusOr<PlanResult> best = fits(lo);
  if (!best.ok()) return best.status();
  return LargestFit{lo, best->parameters, *std::move(best)};
}

std::string PlanResult::Table() const {
  const auto gb = [](double b) { return absl::StrFormat("%.2f GB", b / 1e9); };
  std::string out = absl::StrFormat("hardware %s: %d parameters (%.2f B)\n", hardware, parameters,
                                    parameters / 1e9);
  absl::StrAppend(&out, "\nhost tiers\n", placement.Table(), "\n");
  const std::string weights =
      device.weight_ring
          ? absl::StrFormat("weight ring %.2f layers, %d fragments per micro-batch",
                            static_cast<double>(executor.weight_ring_bytes) /
                                static_cast<double>(std::max<uint64_t>(layer_ring_bytes, 1)),
                            step_fragments)
          : absl::StrFormat("%d weight slots", weight_slots);
  absl::StrAppend(
      &out,
      absl::StrFormat("\ndevice arena (%s, k=%d%s)\n"
                      "  %-17s %s\n  gradient buffers  %s\n"
                      "  activations       %s\n  checkpoints       %s (%d on the device, %d in "
                      "pinned host memory)\n"
                      "  scratch           %s\n%s  peak              %s of %s%s\n",
                      weights, executor.checkpoint_interval, executor.keep_all ? ", keep_all" : "",
                      device.weight_ring ? "weight ring" : "weight slots", gb(device.weight_slots),
                      gb(device.gradient_buffers), gb(device.activations), gb(device.checkpoints),
                      device.device_checkpoints, device.host_checkpoints,
                      gb(device.scratch),
                      device.gradient_sums > 0
                          ? absl::StrFormat("  gradient sums     %s (accumulated on the device; "
                                            "only the last micro-batch copies gradients out)\n",
                                            gb(device.gradient_sums))
                          : "",
                      gb(device_arena_peak), gb(device_arena_capacity),
                      fits_device ? "" : "  DOES NOT FIT"));
  absl::StrAppend(
      &out, absl::StrFormat("\nhost peak resident memory %s = store %s + pinned staging %s + "
                            "fixed overhead %s%s\n",
                            gb(host_peak_bytes), gb(host_store_bytes), gb(host_pinned_staging),
                            gb(host_fixed_overhead),
                            host_arena_bytes > 0
                                ? absl::StrCat(" + emulated device memory ", gb(host_arena_bytes))
                                : ""));
  absl::StrAppend(&out, absl::StrFormat("device peak for weights %s (%s + gradient buffers), "
                                        "activations %s (saved sets + checkpoints)\n",
                                        gb(device.weight_slots + device.gradient_buffers),
                                        device.weight_ring ? "ring" : "slots",
                                        gb(device.activations + device.checkpoints)));
  absl::StrAppend(&out, "\nactivation blocks (policy ",
                  ActivationPolicyName(executor.activation_policy), ")\n");
  for (const BlockDecision& b : activation.blocks) {
    absl::StrAppend(&out, absl::StrFormat("  layers %3d-%-3d %-9s %s\n", b.first_layer,
                                          b.first_layer + b.num_layers - 1,
                                          ActivationModeName(b.mode), b.reason));
  }
  if (nvme_bytes > 0) {
    absl::StrAppend(&out, "\nNVMe ", gb(nvme_bytes), "\n");
    const NvmeTraffic& n = nvme_traffic;
    absl::StrAppend(
        &out,
        absl::StrFormat("NVMe read/written per step %.2f GB / %.2f GB (backward %.2f / %.2f, "
                        "optimizer pass %.2f / %.2f)\n  %s\n",
                        n.read_bytes / 1e9, n.written_bytes / 1e9, n.backward_read_bytes / 1e9,
                        n.backward_written_bytes / 1e9, n.optimizer_read_bytes / 1e9,
                        n.optimizer_written_bytes / 1e9, DescribeNvmeTraffic(n)),
        DriveWearText(drive_wear_limit, drive_wear));
  }
  const StepTimeEstimate& t = time;
  absl::StrAppend(
      &out, absl::StrFormat(
                "\nstep (%.0f tokens)\n"
                "  compute         %9.4f s\n  copy-in         %9.4f s\n"
                "  copy-out        %9.4f s\n  host optimizer  %9.4f s (+ grad norm %.4f s)\n"
                "  nvme            %9.4f s (optimizer pass %.4f s %s, "
                "gradients on copy-out %.4f s, weights on copy-in %.4f s)\n"
                "  exposed stall   %9.4f s\n"
                "  step            %9.4f s   bottleneck: %s\n"
                "  %.1f tokens/s, %.2f model TFLOP/s (6*P*T + causal attention), "
                "%.2f hardware TFLOP/s (with recompute)\n",
                tokens_per_step, t.compute_seconds, t.copy_in_seconds, t.copy_out_seconds,
                t.optimizer_seconds, t.grad_norm_seconds, t.nvme_seconds, t.nvme_optimizer_seconds,
                speculation_credited ? "during the backward" : "beside the next forward",
                t.nvme_backward_seconds, t.nvme_weights_seconds, t.stall_seconds, t.step_seconds,
                t.bottleneck, t.tokens_per_second, t.model_tflops, t.hardware_tflops));
  if (speculation_credited) {
    absl::StrAppend(&out, absl::StrFormat("  %s: it ends %.4f s into the step, %.4f s of it past "
                                          "the backward and the norm pass\n",
                                          speculation_note, t.speculation_end_seconds,
                                          t.speculation_exposed_seconds));
  } else if (!speculation_note.empty()) {
    absl::StrAppend(&out, "  ", speculation_note, "\n");
  }
  return out;
}

std::string PlanResult::ToJson() const {
  nlohmann::json j;
  j["hardware"] = hardware;
  j["parameters"] = parameters;
  j["padded_elements"] = padded_elements;
  nlohmann::json kinds = nlohmann::json::object();
  for (int k = 0; k < tiers::kNumBufferKinds; ++k) {
    const tiers::KindPlacement& p = placement.kinds[k];
    kinds[tiers::BufferKindName(static_cast<BufferKind>(k))] = {
        {"tier", tiers::TierName(p.tier)}, {"bytes", p.bytes}, {"largest_entry", p.largest_entry}};
  }
  j["host_tiers"] = {{"kinds", kinds},
                     {"staging_bytes", placement.staging_bytes},
                     {"pinned_used", placement.pinned_used},
                     {"ram_used", placement.ram_used},
                     {"nvme_used", placement.nvme_used}};
  j["device"] = {{"weight_slots", weight_slots},
                 {"weight_slot_bytes", device.weight_slots},
                 {"weight_ring", device.weight_ring},
                 {"weight_ring_bytes", executor.weight_ring_bytes},
                 {"layer_ring_bytes", layer_ring_bytes},
                 {"fragment_bytes", executor.fragment_bytes},
                 {"step_fragments", step_fragments},
                 {"gradient_buffers", device.gradient_buffers},
                 {"activations", device.activations},
                 {"checkpoints", device.checkpoints},
                 {"device_checkpoints", device.device_checkpoints},
                 {"host_checkpoints", device.host_checkpoints},
                 {"scratch", device.scratch},
                 {"gradient_sums", device.gradient_sums},
                 {"gradient_accumulation",
                  std::string(GradientAccumulationName(executor.gradient_accumulation))},
                 {"arena_peak", device_arena_peak},
                 {"arena_capacity", device_arena_capacity},
                 {"fits", fits_device}};
  j["device_peak"] = {{"weights", device.weight_slots + device.gradient_buffers},
                      {"activations", device.activations + device.checkpoints}};
  nlohmann::json blocks = nlohmann::json::array();
  for (const BlockDecision& b : activation.blocks) {
    blocks.push_back({{"first_layer", b.first_layer},
                      {"num_layers", b.num_layers},
                      {"mode", ActivationModeName(b.mode)},
                      {"reason", b.reason}});
  }
  j["activation"] = {{"policy", ActivationPolicyName(executor.activation_policy)},
                     {"budget_bytes", executor.activation_budget_bytes},
                     {"blocks", blocks}};
  j["host_peak"] = {{"total", host_peak_bytes},
                    {"store", host_store_bytes},
                    {"pinned_staging", host_pinned_staging},
                    {"fixed_overhead", host_fixed_overhead},
                    {"emulated_device_memory", host_arena_bytes}};
  j["step"] = {{"tokens", tokens_per_step},
               {"compute_seconds", time.compute_seconds},
               {"copy_in_seconds", time.copy_in_seconds},
               {"copy_out_seconds", time.copy_out_seconds},
               {"host_optimizer_seconds", time.optimizer_seconds},
               {"grad_norm_seconds", time.grad_norm_seconds},
               {"nvme_seconds", time.nvme_seconds},
               {"nvme_weights_seconds", time.nvme_weights_seconds},
               {"nvme_optimizer_seconds", time.nvme_optimizer_seconds},
               {"nvme_backward_seconds", time.nvme_backward_seconds},
               {"stall_seconds", time.stall_seconds},
               {"step_seconds", time.step_seconds},
               {"bottleneck", time.bottleneck},
               {"tokens_per_second", time.tokens_per_second},
               {"model_tflops", time.model_tflops},
               {"hardware_tflops", time.hardware_tflops},
               {"speculation_credited", speculation_credited},
               {"speculation_end_seconds", time.speculation_end_seconds},
               {"speculation_exposed_seconds", time.speculation_exposed_seconds},
               {"speculation_note", speculation_note}};
  j["nvme_traffic"] = {{"read_bytes_per_step", nvme_traffic.read_bytes},
                       {"written_bytes_per_step", nvme_traffic.written_bytes},
                       {"backward_read_bytes", nvme_traffic.backward_read_bytes},
                       {"backward_written_bytes", nvme_traffic.backward_written_bytes},
                       {"optimizer_read_bytes", nvme_traffic.optimizer_read_bytes},
                       {"optimizer_written_bytes", nvme_traffic.optimizer_written_bytes},
                       {"written_bytes_per_day", drive_wear.written_per_day},
                       {"steps", drive_wear.steps},
                       {"written_bytes_per_run", drive_wear.written_per_run},
                       {"writers", drive_wear.writers},
                       {"rated_tbw_bytes", drive_wear_limit.rated_tbw_bytes},
                       {"wear_warn_share", drive_wear_limit.warn_share},
                       {"share_of_tbw", drive_wear.share_of_tbw},
                       {"wear_warning", drive_wear.warning}};
  return j.dump(2);
}

}  // namespace megatrain::engine::planner
