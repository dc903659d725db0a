// larger_than_ram: trains a named model shape (engine/planner presets) whose
// parameter store does not fit the host budget, with the tiers' placement
// moving what it must to NVMe, and prints one JSON line per step: step wall
// time, pure compute (compute-stream spans), NVMe bytes read and written, NVMe
// wait, and the process's resident memory. bench/larger_than_ram runs it
// beside a disk probe and prints the ratios.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "engine/common/proc_status.h"
#include "engine/device/cpu_device.h"
#include "engine/planner/model_presets.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, preset, "qwen2.5-1.5b", "model shape (megatrain plan --list)");
ABSL_FLAG(int, seq, 256, "sequence length");
ABSL_FLAG(int, micro_batch, 1, "sequences per micro-batch");
ABSL_FLAG(int, micro_batches, 1, "micro-batches per optimizer step");
ABSL_FLAG(int, steps, 3, "optimizer steps");
ABSL_FLAG(int64_t, ram_mib, 10240, "pageable RAM budget (MiB)");
ABSL_FLAG(int64_t, pinned_mib, 0, "pinned RAM budget (MiB)");
ABSL_FLAG(int64_t, arena_mib, 2048, "device arena (MiB)");
ABSL_FLAG(int64_t, weight_ring_mib, 0, "fragment ring (MiB); 0 = weight slots");
ABSL_FLAG(std::string, nvme_dir, "", "NVMe tier directory (block-backed, O_DIRECT)");
ABSL_FLAG(int64_t, nvme_gib, 60, "NVMe tier size (GiB)");
ABSL_FLAG(int64_t, chunk_mib, 64, "NVMe chunk per array (MiB)");
ABSL_FLAG(bool, master_on_nvme, false, "the fp32 master on NVMe too");
ABSL_FLAG(bool, grad_on_nvme, false, "the gradients on NVMe even if RAM could hold them");
ABSL_FLAG(bool, compute_copy_on_nvme, false, "the compute copy on NVMe too (with the master)");
ABSL_FLAG(int, threads, 2, "BLAS and optimizer threads");
ABSL_FLAG(double, grad_clip, 1.0, "global-norm clip (0 = off)");
ABSL_FLAG(std::string, grad_clip_rule, "exact",
          "exact or previous_norm (TrainerOptions::grad_clip_rule, docs/operations.md)");
ABSL_FLAG(double, grad_clip_headroom, megatrain::engine::kDefaultGradClipHeadroom,
          "previous_norm: the plan's headroom over the previous norm (>= 1)");
ABSL_FLAG(bool, speculative_update, false,
          "update during the last backward with clip coefficient 1, or the previous-norm "
          "rule's plan (TrainerOptions)");

namespace megatrain::bench {
namespace {

// Seconds of compute-stream compute spans; only those of the forward (the embedding gather and
// the decoder layers' forward, not the recompute) when `forward_only`.
double ComputeSeconds(const std::vector<engine::TimelineSpan>& spans, bool forward_only) {
  double s = 0;
  for (const engine::TimelineSpan& span : spans) {
    if (span.kind != engine::SpanKind::kCompute || span.stream != "compute") continue;
    if (forward_only && !absl::StartsWith(span.label, "embed.fwd") &&
        !absl::StartsWith(span.label, "layer.fwd.")) {
      continue;
    }
    s += static_cast<double>(span.end_ns - span.begin_ns) * 1e-9;
  }
  return s;
}

int Run() {
  absl::StatusOr<engine::ModelConfig> config =
      engine::planner::ModelPreset(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    fprintf(stderr, "--preset: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  engine::DeviceOptions device_options;
  device_options.arena_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_arena_mib)) << 20;
  // The store's pinned budget plus the executor's pinned staging (gradient
  // chunk, embedding rows, host checkpoints: a few MiB here).
  device_options.pinned_budget_bytes =
      (static_cast<size_t>(absl::GetFlag(FLAGS_pinned_mib)) << 20) + (size_t{256} << 20);
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
  o.memory.enabled = true;
  o.memory.budgets.pinned_ram = static_cast<uint64_t>(absl::GetFlag(FLAGS_pinned_mib)) << 20;
  o.memory.budgets.ram = static_cast<uint64_t>(absl::GetFlag(FLAGS_ram_mib)) << 20;
  o.memory.budgets.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
  o.memory.budgets.nvme_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_nvme_gib)) << 30;
  o.memory.nvme_chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  o.memory.master_on_nvme = absl::GetFlag(FLAGS_master_on_nvme);
  o.memory.grad_on_nvme = absl::GetFlag(FLAGS_grad_on_nvme);
  o.memory.compute_copy_on_nvme = absl::GetFlag(FLAGS_compute_copy_on_nvme);
  o.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  o.speculative_update = absl::GetFlag(FLAGS_speculative_update);
  {
    absl::StatusOr<engine::GradClipRule> rule =
        engine::ParseGradClipRule(absl::GetFlag(FLAGS_grad_clip_rule));
    if (!rule.ok()) {
      fprintf(stderr, "--grad_clip_rule: %s\n", std::string(rule.status().message()).c_str());
      return 2;
    }
    o.grad_clip_rule = *rule;
  }
  o.grad_clip_headroom = absl::GetFlag(FLAGS_grad_clip_headroom);

  const size_t rss_before = ProcStatusBytes("VmRSS");
  absl::StatusOr<std::unique_ptr<engine::Trainer>> trainer =
      engine::Trainer::Create(**device, *config, o);
  if (!trainer.ok()) {
    fprintf(stderr, "trainer: %s\n", std::string(trainer.status().message()).c_str());
    return 2;
  }
  engine::Trainer& t = **trainer;
  fprintf(stderr, "%s", t.placement_table().c_str());
  const auto init0 = std::chrono::steady_clock::now();
  t.InitializeRandom(1);
  if (absl::Status s = t.UpdateStatus(); !s.ok()) {
    fprintf(stderr, "init: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  {
    nlohmann::json init;
    init["event"] = "init";
    init["preset"] = absl::GetFlag(FLAGS_preset);
    init["parameters"] = t.layout().parameter_count();
    init["init_seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - init0).count();
    init["rss_before_bytes"] = rss_before;
    init["vm_hwm_bytes"] = ProcStatusBytes("VmHWM");
    init["pageable_store_bytes"] = t.store().pageable_ram_bytes();
    init["pinned_bytes"] = (*device)->pinned_stats().in_use;
    printf("%s\n", init.dump().c_str());
    fflush(stdout);
  }

  const int64_t tokens = int64_t{o.seq_len} * o.micro_batch_size;
  const int micro_batches = absl::GetFlag(FLAGS_micro_batches);
  std::vector<std::vector<int32_t>> in(micro_batches), tg(micro_batches);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int m = 0; m < micro_batches; ++m) {
    for (int64_t i = 0; i < tokens; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      in[m].push_back(static_cast<int32_t>((state >> 33) % config->vocab_size));
      tg[m].push_back(static_cast<int32_t>((state >> 13) % config->vocab_size));
    }
  }
  std::vector<const int32_t*> in_ptr, tg_ptr;
  for (int m = 0; m < micro_batches; ++m) {
    in_ptr.push_back(in[m].data());
    tg_ptr.push_back(tg[m].data());
  }
  auto last = std::chrono::steady_clock::now();
  for (int s = 0; s < absl::GetFlag(FLAGS_steps); ++s) {
    absl::StatusOr<engine::StepReport> r = t.Step(in_ptr, tg_ptr);
    const auto now = std::chrono::steady_clock::now();
    if (!r.ok()) {
      fprintf(stderr, "step %d: %s\n", s + 1, std::string(r.status().message()).c_str());
      return 1;
    }
    nlohmann::json j;
    j["event"] = "step";
    j["step"] = r->step;
    j["loss"] = r->loss;
    j["grad_norm"] = r->grad_norm;
    j["clip_coefficient"] = r->clip_coefficient;
    j["planned_clip_coefficient"] = r->planned_clip_coefficient;
    // The speculative update of this step: entries updated during the backward, its time, and
    // whether it became the step's update (clip coefficient exactly 1, or the previous-norm
    // rule's plan applied).
    j["speculated_entries"] = r->speculated_entries;
    j["speculation_seconds"] = r->speculation_seconds;
    j["speculation_committed"] = r->speculation_committed;
    j["wall_seconds"] = std::chrono::duration<double>(now - last).count();
    j["forward_backward_seconds"] = r->step_seconds;
    const std::vector<engine::TimelineSpan> spans = (*device)->timeline().Spans();
    j["compute_seconds"] = ComputeSeconds(spans, /*forward_only=*/false);
    // The forward is the part of the step the previous optimizer pass can hide behind: each
    // layer's forward waits for that layer's update (exact global-norm clipping allows no
    // update before the backward ends), so step >= max(forward, pass) + the rest.
    j["forward_compute_seconds"] = ComputeSeconds(spans, /*forward_only=*/true);
    j["optimizer_seconds"] = r->optimizer_seconds;  // the preceding pass
    j["update_wait_seconds"] = r->previous_update_wait_seconds;
    j["nvme_bytes_read"] = r->nvme_bytes_read;
    j["nvme_bytes_written"] = r->nvme_bytes_written;
    j["nvme_wait_seconds"] = r->nvme_wait_seconds;
    j["stall_seconds"] = r->total_stall_seconds;
    j["arena_peak_bytes"] = r->device_arena_peak_bytes;
    j["vm_rss_bytes"] = ProcStatusBytes("VmRSS");
    j["vm_hwm_bytes"] = ProcStatusBytes("VmHWM");
    printf("%s\n", j.dump().c_str());
    fflush(stdout);
    last = now;
  }
  // The last update pass, so its NVMe traffic is counted too.
  const auto wait0 = std::chrono::steady_clock::now();
  if (absl::Status s = t.UpdateStatus(); !s.ok()) {
    fprintf(stderr, "last update: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  nlohmann::json end;
  end["event"] = "end";
  end["last_update_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait0).count();
  end["vm_hwm_bytes"] = ProcStatusBytes("VmHWM");
  printf("%s\n", end.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace megatrain::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::bench::Run();
}
