// compute_breakdown: trains a preset's shape (optionally fewer layers) on the CPU device, all in
// RAM, and prints the measured compute stream's time by op label next to the planner's
// predicted compute for the same configuration on a probe taken just before (docs/planning.md,
// "The 1.5B run against the model"). A benchmark, not a test: it depends on the machine's speed.
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/device/cpu_device.h"
#include "engine/device/timeline.h"
#include "engine/planner/local_probe.h"
#include "engine/planner/model_presets.h"
#include "engine/planner/planner.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, preset, "qwen2.5-1.5b", "model shape");
ABSL_FLAG(int, layers, 4, "num_hidden_layers override (0 = the preset's)");
ABSL_FLAG(int, seq, 256, "sequence length");
ABSL_FLAG(int, micro_batch, 1, "sequences per micro-batch");
ABSL_FLAG(int, steps, 2, "optimizer steps (the last one is reported)");
ABSL_FLAG(int64_t, arena_mib, 3584, "device arena (MiB)");
ABSL_FLAG(int64_t, weight_ring_mib, 1000, "fragment ring (MiB); 0 = weight slots");
ABSL_FLAG(int, threads, 2, "BLAS and optimizer threads");
ABSL_FLAG(int64_t, pinned_mib, -1, "pinned RAM budget (MiB); -1 = no budgets (all in RAM, pinned)");
ABSL_FLAG(int64_t, ram_mib, 0, "pageable RAM budget (MiB), with --pinned_mib");
ABSL_FLAG(std::string, nvme_dir, "", "NVMe tier directory, with --pinned_mib");
ABSL_FLAG(int64_t, nvme_gib, 60, "NVMe tier size (GiB)");

namespace megatrain::bench {
namespace {

int Run() {
  absl::StatusOr<engine::ModelConfig> config =
      engine::planner::ModelPreset(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    fprintf(stderr, "--preset: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_layers) > 0) config->num_hidden_layers = absl::GetFlag(FLAGS_layers);
  engine::DeviceOptions device_options;
  device_options.arena_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_arena_mib)) << 20;
  device_options.pinned_budget_bytes = size_t{64} << 30;
  absl::StatusOr<std::unique_ptr<engine::CpuDevice>> device =
      engine::CpuDevice::Create(device_options);
  if (!device.ok()) {
    fprintf(stderr, "device: %s\n", std::string(device.status().message()).c_str());
    return 2;
  }
  engine::TrainerOptions o;
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch);
  o.seq_len = absl::GetFlag(FLAGS_seq);
  o.lr.peak_lr = 1e-4;
  o.lr.total_steps = static_cast<uint64_t>(absl::GetFlag(FLAGS_steps));
  o.blas_threads = o.optimizer_threads = absl::GetFlag(FLAGS_threads);
  o.collect_timeline = true;
  o.executor.weight_ring_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_weight_ring_mib)) << 20;
  engine::planner::PlanInputs in;
  if (absl::GetFlag(FLAGS_pinned_mib) >= 0) {
    o.memory.enabled = in.budgets_enabled = true;
    o.memory.budgets.pinned_ram = static_cast<uint64_t>(absl::GetFlag(FLAGS_pinned_mib)) << 20;
    o.memory.budgets.ram = static_cast<uint64_t>(absl::GetFlag(FLAGS_ram_mib)) << 20;
    o.memory.budgets.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
    o.memory.budgets.nvme_bytes = o.memory.budgets.nvme_dir.empty()
                                      ? 0
                                      : static_cast<uint64_t>(absl::GetFlag(FLAGS_nvme_gib)) << 30;
    in.budgets = o.memory.budgets;
  }

  // The planner's view of the same run, on a probe taken now.
  engine::planner::ProbeOptions probe;
  probe.blas_threads = probe.optimizer_threads = absl::GetFlag(FLAGS_threads);
  probe.arena_bytes = device_options.arena_bytes;
  absl::StatusOr<engine::planner::HardwareProfile> hw = engine::planner::ProbeLocalCpu(probe);
  if (!hw.ok()) return 2;
  in.micro_batch = o.micro_batch_size;
  in.seq = o.seq_len;
  in.weight_ring_bytes = o.executor.weight_ring_bytes;
  in.device_arena_bytes = device_options.arena_bytes;
  absl::StatusOr<engine::planner::PlanResult> plan = engine::planner::Plan(*config, in, *hw);
  if (!plan.ok()) {
    fprintf(stderr, "plan: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }

  absl::StatusOr<std::unique_ptr<engine::Trainer>> trainer =
      engine::Trainer::Create(**device, *config, o);
  if (!trainer.ok()) {
    fprintf(stderr, "trainer: %s\n", std::string(trainer.status().message()).c_str());
    return 2;
  }
  engine::Trainer& t = **trainer;
  t.InitializeRandom(1);
  const int64_t tokens = int64_t{o.seq_len} * o.micro_batch_size;
  std::vector<int32_t> input, target;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < tokens; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    input.push_back(static_cast<int32_t>((state >> 33) % config->vocab_size));
    target.push_back(static_cast<int32_t>((state >> 13) % config->vocab_size));
  }
  std::vector<const int32_t*> in_ptr = {input.data()}, tg_ptr = {target.data()};
  nlohmann::json j;
  for (int s = 0; s < absl::GetFlag(FLAGS_steps); ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<engine::StepReport> r = t.Step(in_ptr, tg_ptr);
    if (!r.ok()) {
      fprintf(stderr, "step: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    j["wall_seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::map<std::string, double> by_label;
  double compute = 0;
  for (const engine::TimelineSpan& span : (*device)->timeline().Spans()) {
    if (span.kind != engine::SpanKind::kCompute || span.stream != "compute") continue;
    const double s = static_cast<double>(span.end_ns - span.begin_ns) * 1e-9;
    by_label[span.label] += s;
    compute += s;
  }
  j["preset"] = absl::GetFlag(FLAGS_preset);
  j["layers"] = config->num_hidden_layers;
  j["parameters"] = plan->parameters;
  j["probe"] = hw->description;
  j["measured_compute_seconds"] = compute;
  j["measured_compute_by_label"] = by_label;
  j["predicted_compute_seconds"] = plan->time.compute_seconds;
  j["predicted_step_seconds"] = plan->time.step_seconds;
  j["predicted_hardware_tflop"] = plan->time.hardware_tflops * plan->time.step_seconds;
  printf("%s\n", j.dump(1).c_str());
  return 0;
}

}  // namespace
}  // namespace megatrain::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::bench::Run();
}
