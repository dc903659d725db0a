// plan: prints the planner's table (or --json) for a model (config.json or preset) on a
// hardware profile (built-in, from --profiles, or `local` = probe this machine as the CPU
// device). With --largest it also prints the largest model of that shape that fits; with
// --devices/--nodes or --scaling the data-parallel prediction (data_parallel.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/planner/data_parallel.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/local_probe.h"
#include "engine/planner/model_presets.h"
#include "engine/planner/planner.h"
#include "engine/train/grad_clip_rule.h"

ABSL_FLAG(std::string, config, "", "path of an HF config.json (or use --preset)");
ABSL_FLAG(std::string, preset, "", "model preset name (see --list)");
ABSL_FLAG(std::string, hardware, "local", "hardware profile name, or `local` to probe");
ABSL_FLAG(std::string, profiles, "", "JSON file of extra/overriding hardware profiles");
ABSL_FLAG(bool, list, false, "list presets and hardware profiles, then exit");
ABSL_FLAG(bool, json, false, "print JSON instead of the table");
ABSL_FLAG(int, micro_batch, 1, "sequences per micro-batch");
ABSL_FLAG(int, seq, 1024, "tokens per sequence");
ABSL_FLAG(int, grad_accumulation, 1, "micro-batches per optimizer step");
ABSL_FLAG(int, k, 4, "activation checkpoint interval");
ABSL_FLAG(bool, keep_all, false, "keep every activation (no recompute)");
ABSL_FLAG(int, weight_slots, 2, "device weight slots; 0 = as many as fit");
ABSL_FLAG(double, weight_ring_layers, 0,
          "fragmented weight streaming through a device ring of this many layers (0.5 = half a "
          "layer); 0 = whole-layer weight slots");
ABSL_FLAG(uint64_t, weight_ring_bytes, 0,
          "fragmented weight streaming through a device ring of this many bytes (or use "
          "--weight_ring_layers)");
ABSL_FLAG(uint64_t, fragment_bytes, 0, "largest weight fragment in bytes; 0 = 4 MiB");
ABSL_FLAG(int, device_checkpoints, -1,
          "activation checkpoints kept on the device (the rest in pinned host memory); -1 = as "
          "many as fit the arena");
ABSL_FLAG(double, activation_budget_gb, 0,
          "device GB (1e9) for saved activation sets; 0 = the k working sets");
ABSL_FLAG(std::string, activation_policy, "recompute",
          "blocks beyond the activation budget: recompute, offload or adaptive");
ABSL_FLAG(double, arena_gb, 0, "device arena GB (1e9); 0 = the profile's device memory");
ABSL_FLAG(double, pinned_gb, -1, "pinned host budget GB; <0 = no budgets (all in RAM)");
ABSL_FLAG(double, ram_gb, 0, "pageable host budget GB (with --pinned_gb)");
ABSL_FLAG(std::string, nvme_dir, "", "NVMe tier directory (with --pinned_gb)");
ABSL_FLAG(double, nvme_gb, 0, "NVMe tier budget GB");
ABSL_FLAG(bool, states_on_nvme, false, "m and v on NVMe even when RAM could hold them");
ABSL_FLAG(bool, master_on_nvme, false, "the fp32 master on NVMe too, streamed with m and v");
ABSL_FLAG(std::string, gradient_accumulation, "auto",
          "where a step's gradients are summed over its micro-batches (train_local "
          "--gradient_accumulation): host, device or auto (device on a GPU profile when the "
          "sums fit the arena and --grad_accumulation > 1)");
ABSL_FLAG(bool, speculative_update, false,
          "the speculative update (train_local --speculative_update): count its alternate "
          "master/m/v (regions on NVMe for those on NVMe, arrays in RAM for those in RAM: all on "
          "NVMe, all in RAM, or the master in RAM with m and v on NVMe) and, with "
          "--grad_clip=0, overlap the optimizer pass with the last micro-batch's backward in the "
          "step time");
ABSL_FLAG(double, grad_clip, 0,
          "the run's global-norm clip (0 = off): with --speculative_update a clip > 0 is not "
          "credited (a clipped step discards the speculation and pays the normal pass)");
ABSL_FLAG(std::string, grad_clip_rule, "exact",
          "exact, or previous_norm (train_local --clip_rule): with --speculative_update and a "
          "clip, a clipped step commits too while the planned coefficient holds, so the overlap "
          "is credited");
ABSL_FLAG(bool, grad_on_nvme, false,
          "the fp32 gradients on NVMe too (all but the embedding's), even if RAM fits them");
ABSL_FLAG(bool, compute_copy_on_nvme, false,
          "the compute copy on NVMe too (with the master): every per-parameter array but the "
          "embedding's copy and gradient");
ABSL_FLAG(int64_t, nvme_chunk_mib, 64,
          "MiB per array of the chunks NVMe traffic and the host optimizer work in");
ABSL_FLAG(uint64_t, steps, 0,
          "optimizer steps of the run (NVMe written per run, drive wear); 0 = open-ended: judged "
          "per day of continuous training");
ABSL_FLAG(double, nvme_rated_tbw, 0,
          "rated endurance of the NVMe tier's drives in TB (1e12 bytes, summed over a striped "
          "array); warn when the run writes more than --nvme_wear_warn_share of it; 0 = off");
ABSL_FLAG(double, nvme_wear_warn_share, 0.1, "share of the rated TBW a run may write");
ABSL_FLAG(bool, largest, false, "also search the deepest model of this shape that fits");
ABSL_FLAG(int, blas_threads, 2, "local: OpenBLAS threads of the run");
ABSL_FLAG(int, optimizer_threads, 2, "local: AdamW threads of the run");
ABSL_FLAG(double, link_gbps, 0, "local: emulated link GB/s; 0 = unthrottled");
ABSL_FLAG(double, link_latency_us, 0, "local: emulated link latency us");
ABSL_FLAG(double, nvme_read_gbps, 2.0, "local: NVMe read GB/s (bench/nvme)");
ABSL_FLAG(double, nvme_write_gbps, 2.5, "local: NVMe write GB/s (bench/nvme)");
ABSL_FLAG(int, devices, 1,
          "data parallel: devices per node, each running --micro_batch x --grad_accumulation "
          "(the global batch is devices x nodes x that)");
ABSL_FLAG(int, nodes, 1, "data parallel: nodes of --devices each (ZeRO-1 across nodes)");
ABSL_FLAG(bool, scaling, false,
          "print the data-parallel table: 1, 2, 4, 8 devices in a node, then 2 and 4 nodes of 8");
ABSL_FLAG(double, peer_gbps, 0,
          "override the profile's device-to-device GB/s each direction (0 = keep)");
ABSL_FLAG(double, network_gbps, 0,
          "override the profile's node-to-node GB/s each direction per node (0 = keep)");
ABSL_FLAG(double, compute_efficiency, 0, "override the profile's compute efficiency (0 = keep)");

namespace megatrain::engine::planner {
namespace {

int Run() {
  std::vector<HardwareProfile> profiles = BuiltinHardwareProfiles();
  if (!absl::GetFlag(FLAGS_profiles).empty()) {
    auto extended = ExtendHardwareProfiles(std::move(profiles), absl::GetFlag(FLAGS_profiles));
    if (!extended.ok()) {
      fprintf(stderr, "plan: %s\n", std::string(extended.status().message()).c_str());
      return 2;
    }
    profiles = *std::move(extended);
  }
  if (absl::GetFlag(FLAGS_list)) {
    printf("presets: %s\nhardware:\n", absl::StrJoin(ModelPresetNames(), ", ").c_str());
    for (const HardwareProfile& p : profiles) {
      printf("  %-12s %s\n", p.name.c_str(), p.description.c_str());
    }
    printf("  %-12s this machine as the CPU device (probed)\n", "local");
    return 0;
  }
  absl::StatusOr<ModelConfig> config =
      !absl::GetFlag(FLAGS_config).empty() ? LoadModelConfig(absl::GetFlag(FLAGS_config))
      : !absl::GetFlag(FLAGS_preset).empty()
          ? ModelPreset(absl::GetFlag(FLAGS_preset))
          : absl::StatusOr<ModelConfig>(absl::InvalidArgumentError("give --config or --preset"));
  if (!config.ok()) {
    fprintf(stderr, "plan: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  PlanInputs in;
  in.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  in.seq = absl::GetFlag(FLAGS_seq);
  in.grad_accumulation = absl::GetFlag(FLAGS_grad_accumulation);
  in.checkpoint_interval = absl::GetFlag(FLAGS_k);
  in.keep_all = absl::GetFlag(FLAGS_keep_all);
  in.weight_slots = absl::GetFlag(FLAGS_weight_slots);
  in.device_checkpoints = absl::GetFlag(FLAGS_device_checkpoints);
  in.weight_ring_layers = absl::GetFlag(FLAGS_weight_ring_layers);
  in.weight_ring_bytes = absl::GetFlag(FLAGS_weight_ring_bytes);
  in.fragment_bytes = absl::GetFlag(FLAGS_fragment_bytes);
  in.activation_budget_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_activation_budget_gb) * 1e9);
  {
    absl::StatusOr<ActivationPolicyKind> policy =
        ParseActivationPolicy(absl::GetFlag(FLAGS_activation_policy));
    if (!policy.ok()) {
      fprintf(stderr, "--activation_policy: %s\n", std::string(policy.status().message()).c_str());
      return 2;
    }
    in.activation_policy = *policy;
  }
  {
    absl::StatusOr<GradientAccumulation> accumulation =
        ParseGradientAccumulation(absl::GetFlag(FLAGS_gradient_accumulation));
    if (!accumulation.ok()) {
      fprintf(stderr, "--%s\n", std::string(accumulation.status().message()).c_str());
      return 2;
    }
    in.gradient_accumulation = *accumulation;
  }
  in.device_arena_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_arena_gb) * 1e9);
  if (absl::GetFlag(FLAGS_pinned_gb) >= 0) {
    in.budgets_enabled = true;
    in.budgets.pinned_ram = static_cast<uint64_t>(absl::GetFlag(FLAGS_pinned_gb) * 1e9);
    in.budgets.ram = static_cast<uint64_t>(absl::GetFlag(FLAGS_ram_gb) * 1e9);
    in.budgets.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
    in.budgets.nvme_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_nvme_gb) * 1e9);
  }
  in.states_on_nvme = absl::GetFlag(FLAGS_states_on_nvme);
  in.master_on_nvme = absl::GetFlag(FLAGS_master_on_nvme);
  in.speculative_update = absl::GetFlag(FLAGS_speculative_update);
  in.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  absl::StatusOr<GradClipRule> rule = ParseGradClipRule(absl::GetFlag(FLAGS_grad_clip_rule));
  if (!rule.ok()) {
    fprintf(stderr, "--grad_clip_rule: %s\n", std::string(rule.status().message()).c_str());
    return 2;
  }
  in.previous_norm_clip = *rule == GradClipRule::kPreviousNorm;
  if (in.previous_norm_clip && in.grad_clip == 0) {
    fprintf(stderr, "--grad_clip_rule=previous_norm needs a clip (--grad_clip > 0)\n");
    return 2;
  }
  in.grad_on_nvme = absl::GetFlag(FLAGS_grad_on_nvme);
  in.compute_copy_on_nvme = absl::GetFlag(FLAGS_compute_copy_on_nvme);
  in.nvme_chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_nvme_chunk_mib)) << 20;
  in.steps = absl::GetFlag(FLAGS_steps);
  if (absl::GetFlag(FLAGS_nvme_rated_tbw) < 0) {
    fprintf(stderr, "plan: --nvme_rated_tbw=%g is negative\n", absl::GetFlag(FLAGS_nvme_rated_tbw));
    return 2;
  }
  in.drive_wear.rated_tbw_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_nvme_rated_tbw) * 1e12);
  in.drive_wear.warn_share = absl::GetFlag(FLAGS_nvme_wear_warn_share);

  absl::StatusOr<HardwareProfile> hw;
  if (absl::GetFlag(FLAGS_hardware) == "local") {
    ProbeOptions o;
    o.blas_threads = absl::GetFlag(FLAGS_blas_threads);
    o.optimizer_threads = absl::GetFlag(FLAGS_optimizer_threads);
    o.link_gbps = absl::GetFlag(FLAGS_link_gbps);
    o.link_latency_us = absl::GetFlag(FLAGS_link_latency_us);
    o.nvme_read_gbps = absl::GetFlag(FLAGS_nvme_read_gbps);
    o.nvme_write_gbps = absl::GetFlag(FLAGS_nvme_write_gbps);
    if (in.device_arena_bytes > 0) o.arena_bytes = in.device_arena_bytes;
    hw = ProbeLocalCpu(o);
  } else {
    hw = FindHardwareProfile(profiles, absl::GetFlag(FLAGS_hardware));
  }
  if (!hw.ok()) {
    fprintf(stderr, "plan: %s\n", std::string(hw.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_compute_efficiency) > 0) {
    hw->compute_efficiency = absl::GetFlag(FLAGS_compute_efficiency);
  }
  if (absl::GetFlag(FLAGS_peer_gbps) > 0) hw->peer_gbps = absl::GetFlag(FLAGS_peer_gbps);
  if (absl::GetFlag(FLAGS_network_gbps) > 0) hw->network_gbps = absl::GetFlag(FLAGS_network_gbps);
  absl::StatusOr<PlanResult> plan = Plan(*config, in, *hw);
  if (!plan.ok()) {
    fprintf(stderr, "plan: %s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  std::vector<DataParallelShape> shapes;
  if (absl::GetFlag(FLAGS_scaling)) shapes = DefaultScalingShapes(*hw);
  if (absl::GetFlag(FLAGS_devices) != 1 || absl::GetFlag(FLAGS_nodes) != 1) {
    shapes.push_back({absl::GetFlag(FLAGS_devices), absl::GetFlag(FLAGS_nodes)});
  }
  absl::StatusOr<std::vector<DataParallelPrediction>> scaling = PredictScaling(*plan, *hw, shapes);
  if (!scaling.ok()) {
    fprintf(stderr, "plan: %s\n", std::string(scaling.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_json)) {
    if (shapes.empty()) {
      printf("%s\n", plan->ToJson().c_str());
    } else {
      printf("{\"plan\": %s,\n\"data_parallel\": %s}\n", plan->ToJson().c_str(),
             ScalingJson(*scaling).c_str());
    }
  } else {
    printf("%s\n%s", hw->description.c_str(), plan->Table().c_str());
    if (!shapes.empty()) printf("\n%s", ScalingTable(*scaling).c_str());
  }
  if (absl::GetFlag(FLAGS_largest)) {
    absl::StatusOr<LargestFit> fit = LargestModelThatFits(*config, in, *hw);
    if (!fit.ok()) {
      printf("largest model of this shape: %s\n", std::string(fit.status().message()).c_str());
    } else {
      const PlanResult& b = fit->plan;
      printf("largest model of this shape that fits: %d layers, %.2f B parameters\n",
             fit->num_layers, fit->parameters / 1e9);
      printf("  its tiers:\n%s", b.placement.Table().c_str());
      printf("  host peak %.2f GB, device arena peak %.2f GB, NVMe %.2f GB\n",
             b.host_peak_bytes / 1e9, b.device_arena_peak / 1e9, b.nvme_bytes / 1e9);
      printf("  NVMe read/written per step %.2f / %.2f GB; written per day %.1f TB\n",
             b.nvme_traffic.read_bytes / 1e9, b.nvme_traffic.written_bytes / 1e9,
             b.drive_wear.written_per_day / 1e12);
      printf(
          "  step %.1f s (compute %.1f s, nvme %.1f s), bottleneck %s: %.0f tokens/s, "
          "%.1f model TFLOP/s\n",
          b.time.step_seconds, b.time.compute_seconds, b.time.nvme_seconds,
          b.time.bottleneck.c_str(), b.time.tokens_per_second, b.time.model_tflops);
    }
  }
  return plan->fits_device ? 0 : 1;
}

}  // namespace
}  // namespace megatrain::engine::planner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::engine::planner::Run();
}
