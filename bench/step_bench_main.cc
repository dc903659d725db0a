// step_bench: end-to-end training-step throughput of the Trainer on the CPU device for a Llama
// config given by flags; prints one JSON line (see bench/step_vs_torch, bench/streaming).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/common/proc_status.h"
#include "engine/device/cpu_device.h"
#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"
#include "engine/exec/executor_geometry.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, hidden, 512, "hidden size d");
ABSL_FLAG(int, layers, 4, "decoder layers");
ABSL_FLAG(int, ffn, 1376, "MLP intermediate size");
ABSL_FLAG(int, heads, 8, "attention heads");
ABSL_FLAG(int, kv_heads, 8, "key/value heads");
ABSL_FLAG(int, vocab, 32000, "vocabulary size");
ABSL_FLAG(int, seq, 256, "sequence length");
ABSL_FLAG(int, micro_batch, 4, "sequences per micro-batch");
ABSL_FLAG(int, micro_batches, 1, "micro-batches per optimizer step");
ABSL_FLAG(int, k, 4, "checkpoint interval (ignored with --keep_all)");
ABSL_FLAG(bool, keep_all, false, "keep every activation, recompute nothing");
ABSL_FLAG(int, weight_slots, 0, "device weight slots: 0 = auto (all resident if the arena fits)");
ABSL_FLAG(int, device_checkpoints, -1,
          "activation checkpoints kept on the device (the rest in pinned host memory); -1 = as "
          "many as fit the arena");
ABSL_FLAG(double, weight_ring_layers, 0,
          "fragmented weight streaming: a weight ring of this many layers' tensors (0 = off)");
ABSL_FLAG(int64_t, weight_ring_bytes, 0,
          "fragmented weight streaming: weight ring bytes (overrides --weight_ring_layers)");
ABSL_FLAG(int64_t, fragment_bytes, 0, "largest fragment (row block) in bytes; 0 = default");
ABSL_FLAG(int64_t, arena_mb, 4096, "device arena MiB (untouched pages cost no RAM)");
ABSL_FLAG(double, link_gbps, 0, "emulated link GB/s per direction; 0 = unthrottled");
ABSL_FLAG(double, link_latency_us, 0, "emulated link latency per copy (us)");
ABSL_FLAG(bool, serial, false, "no copy/compute overlap (baseline)");
ABSL_FLAG(std::string, activation_policy, "recompute",
          "blocks beyond the activation budget: recompute, offload or adaptive");
ABSL_FLAG(uint64_t, activation_budget_bytes, 0,
          "device bytes for saved activation sets; 0 = the k working sets");
ABSL_FLAG(int, steps, 10, "measured steps (after warmup)");
ABSL_FLAG(int, warmup, 2, "unmeasured warm-up steps");
ABSL_FLAG(int, blas_threads, 2, "OpenBLAS threads");
ABSL_FLAG(int, optimizer_threads, 2, "host AdamW threads");
ABSL_FLAG(uint64_t, seed, 1, "parameter and token seed");
ABSL_FLAG(std::string, nvme_dir, "",
          "put AdamW m and v on the NVMe tier in this block-backed directory (O_DIRECT)");

namespace megatrain::bench {
namespace {

using engine::SpanKind;
using engine::TimelineSpan;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

absl::StatusOr<engine::ModelConfig> ConfigFromFlags() {
  const int seq = absl::GetFlag(FLAGS_seq);
  const std::string json = absl::StrCat(
      R"({"model_type": "llama", "vocab_size": )", absl::GetFlag(FLAGS_vocab),
      R"(, "hidden_size": )", absl::GetFlag(FLAGS_hidden), R"(, "intermediate_size": )",
      absl::GetFlag(FLAGS_ffn), R"(, "num_hidden_layers": )", absl::GetFlag(FLAGS_layers),
      R"(, "num_attention_heads": )", absl::GetFlag(FLAGS_heads), R"(, "num_key_value_heads": )",
      absl::GetFlag(FLAGS_kv_heads), R"(, "max_position_embeddings": )", std::max(seq, 2048),
      R"(, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": false})");
  return engine::ParseModelConfig(json);
}

// Per-step figures read from the device timeline (compute stream spans by op label).
struct TimelineFigures {
  double layer_forward_seconds = 0;   // mean over layers of "layer.fwd.*"
  double layer_backward_seconds = 0;  // mean over layers of "layer.bwd.*"
  double layer_recompute_seconds = 0;
  double head_seconds = 0;
  double weight_copies_per_layer = 0;  // weight copy-in spans per layer per step
};

TimelineFigures ReadTimeline(const std::vector<TimelineSpan>& spans, int layers) {
  TimelineFigures f;
  int weight_copies = 0;
  for (const TimelineSpan& s : spans) {
    const double sec = static_cast<double>(s.end_ns - s.begin_ns) * 1e-9;
    if (s.kind == SpanKind::kCompute && s.stream == "compute") {
      if (absl::StartsWith(s.label, "layer.fwd.")) f.layer_forward_seconds += sec;
      if (absl::StartsWith(s.label, "layer.bwd.")) f.layer_backward_seconds += sec;
      if (absl::StartsWith(s.label, "layer.recompute.")) f.layer_recompute_seconds += sec;
      if (s.label == "head") f.head_seconds += sec;
    }
    if (s.kind == SpanKind::kCopyIn && s.layer >= 0 && absl::StartsWith(s.label, "layer.")) {
      ++weight_copies;
    }
  }
  f.layer_forward_seconds /= layers;
  f.layer_backward_seconds /= layers;
  f.layer_recompute_seconds /= layers;
  f.weight_copies_per_layer = static_cast<double>(weight_copies) / layers;
  return f;
}

int Run() {
  absl::StatusOr<engine::ModelConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    fprintf(stderr, "config: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  engine::DeviceOptions device_options;
  device_options.arena_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_arena_mb)) << 20;
  device_options.pinned_budget_bytes = size_t{64} << 30;
  device_options.link_gbps = absl::GetFlag(FLAGS_link_gbps);
  device_options.link_latency_us = absl::GetFlag(FLAGS_link_latency_us);
  absl::StatusOr<std::unique_ptr<engine::CpuDevice>> device =
      engine::CpuDevice::Create(device_options);
  if (!device.ok()) {
    fprintf(stderr, "device: %s\n", std::string(device.status().message()).c_str());
    return 2;
  }

  const int seq = absl::GetFlag(FLAGS_seq);
  const int micro_batch = absl::GetFlag(FLAGS_micro_batch);
  const int micro_batches = absl::GetFlag(FLAGS_micro_batches);
  engine::TrainerOptions options;
  options.micro_batch_size = micro_batch;
  options.seq_len = seq;
  options.lr.peak_lr = 3e-4;
  options.lr.cosine = false;
  options.executor.checkpoint_interval = absl::GetFlag(FLAGS_k);
  options.executor.keep_all = absl::GetFlag(FLAGS_keep_all);
  options.executor.device_checkpoints = absl::GetFlag(FLAGS_device_checkpoints);
  options.executor.serial = absl::GetFlag(FLAGS_serial);
  options.executor.weight_slots = absl::GetFlag(FLAGS_weight_slots);
  // The ring of N layers: N x the bytes one layer's tensors take in the ring.
  size_t layer_ring_bytes = 0;
  {
    absl::StatusOr<engine::ParameterLayout> layout = engine::ParameterLayout::Create(*config);
    if (!layout.ok()) {
      fprintf(stderr, "layout: %s\n", std::string(layout.status().message()).c_str());
      return 2;
    }
    absl::StatusOr<engine::ExecutorGeometry> g =
        engine::MakeExecutorGeometry(*config, *layout, micro_batch, seq, 0);
    if (!g.ok()) {
      fprintf(stderr, "geometry: %s\n", std::string(g.status().message()).c_str());
      return 2;
    }
    layer_ring_bytes = engine::StreamingExecutor::LayerRingBytes(g->dims, g->layout.layer_offsets);
  }
  if (absl::GetFlag(FLAGS_weight_ring_bytes) > 0) {
    options.executor.weight_ring_bytes =
        static_cast<size_t>(absl::GetFlag(FLAGS_weight_ring_bytes));
  } else if (absl::GetFlag(FLAGS_weight_ring_layers) > 0) {
    options.executor.weight_ring_bytes = static_cast<size_t>(
        absl::GetFlag(FLAGS_weight_ring_layers) * static_cast<double>(layer_ring_bytes));
  }
  options.executor.fragment_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_fragment_bytes));
  absl::StatusOr<engine::ActivationPolicyKind> policy =
      engine::ParseActivationPolicy(absl::GetFlag(FLAGS_activation_policy));
  if (!policy.ok()) {
    fprintf(stderr, "--activation_policy: %s\n", std::string(policy.status().message()).c_str());
    return 2;
  }
  options.executor.activation_policy = *policy;
  options.executor.activation_budget_bytes = absl::GetFlag(FLAGS_activation_budget_bytes);
  options.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  options.optimizer_threads = absl::GetFlag(FLAGS_optimizer_threads);
  options.collect_timeline = true;  // needed for stall figures; two clock reads per op
  if (!absl::GetFlag(FLAGS_nvme_dir).empty()) {
    // Budgets large enough for everything but the states, which are asked onto NVMe.
    options.memory.enabled = true;
    options.memory.states_on_nvme = true;
    options.memory.budgets.pinned_ram = uint64_t{48} << 30;
    options.memory.budgets.ram = uint64_t{16} << 30;
    options.memory.budgets.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
    options.memory.budgets.nvme_bytes = uint64_t{1} << 40;
  }

  absl::StatusOr<std::unique_ptr<engine::Trainer>> trainer =
      engine::Trainer::Create(**device, *config, options);
  if (!trainer.ok()) {
    fprintf(stderr, "trainer: %s\n", std::string(trainer.status().message()).c_str());
    return 2;
  }
  engine::Trainer& t = **trainer;
  t.InitializeRandom(absl::GetFlag(FLAGS_seed));

  // Random tokens from a fixed LCG: throughput does not depend on the values.
  const int64_t tokens = int64_t{seq} * micro_batch;
  const int vocab = absl::GetFlag(FLAGS_vocab);
  std::vector<std::vector<int32_t>> in(micro_batches), tg(micro_batches);
  uint64_t state = absl::GetFlag(FLAGS_seed) * 0x9E3779B97F4A7C15ull + 1;
  for (int m = 0; m < micro_batches; ++m) {
    in[m].resize(tokens);
    tg[m].resize(tokens);
    for (int64_t i = 0; i < tokens; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      in[m][i] = static_cast<int32_t>((state >> 33) % vocab);
      tg[m][i] = static_cast<int32_t>((state >> 13) % vocab);
    }
  }
  std::vector<const int32_t*> in_ptr, tg_ptr;
  for (int m = 0; m < micro_batches; ++m) {
    in_ptr.push_back(in[m].data());
    tg_ptr.push_back(tg[m].data());
  }

  // Wall time between consecutive Step() returns: forward + backward, the wait for the previous
  // step's asynchronous AdamW, gradient norm — everything a training loop pays per step.
  std::vector<double> wall, fb, stall, copy_in, update_wait, layer_fwd, layer_bwd, layer_rec, head,
      copies, optimizer;
  uint64_t arena_peak = 0;
  double last_loss = 0;
  std::string activation_modes;  // per block, of the last measured step
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  auto last = std::chrono::steady_clock::now();
  for (int s = 0; s < warmup + steps; ++s) {
    absl::StatusOr<engine::StepReport> r = t.Step(in_ptr, tg_ptr);
    const auto now = std::chrono::steady_clock::now();
    if (!r.ok()) {
      fprintf(stderr, "step %d: %s\n", s, std::string(r.status().message()).c_str());
      return 1;
    }
    const double seconds = std::chrono::duration<double>(now - last).count();
    last = now;
    last_loss = r->loss;
    if (s < warmup) continue;
    wall.push_back(seconds);
    fb.push_back(r->step_seconds);
    stall.push_back(r->total_stall_seconds);
    copy_in.push_back(r->total_copy_in_seconds);
    update_wait.push_back(r->previous_update_wait_seconds);
    optimizer.push_back(r->optimizer_seconds);
    arena_peak = std::max(arena_peak, r->device_arena_peak_bytes);
    activation_modes.clear();
    for (const engine::ActivationBlockReport& b : r->activation_blocks) {
      absl::StrAppend(&activation_modes, activation_modes.empty() ? "" : ",", b.mode);
    }
    const TimelineFigures f =
        ReadTimeline((*device)->timeline().Spans(), config->num_hidden_layers);
    layer_fwd.push_back(f.layer_forward_seconds);
    layer_bwd.push_back(f.layer_backward_seconds);
    layer_rec.push_back(f.layer_recompute_seconds);
    head.push_back(f.head_seconds);
    copies.push_back(f.weight_copies_per_layer);
  }
  t.WaitForUpdates();

  int64_t layer_elements = 0;
  for (int e = 0; e < t.layout().num_entries(); ++e) {
    if (t.layout().entries()[e].layer == 0) layer_elements += t.store().spec(e).elements;
  }
  const double step_s = Median(wall);
  const double stall_s = Median(stall);
  nlohmann::json out;
  out["bench"] = "step_bench";
  out["config"] = {{"hidden", config->hidden_size},
                   {"layers", config->num_hidden_layers},
                   {"ffn", config->intermediate_size},
                   {"heads", config->num_attention_heads},
                   {"kv_heads", config->num_key_value_heads},
                   {"vocab", config->vocab_size},
                   {"seq", seq},
                   {"micro_batch", micro_batch},
                   {"micro_batches", micro_batches},
                   {"k", options.executor.checkpoint_interval},
                   {"keep_all", options.executor.keep_all},
                   {"weight_slots_flag", options.executor.weight_slots},
                   {"weight_slots", t.executor().weight_slots()},
                   {"weight_ring_bytes", options.executor.weight_ring_bytes},
                   {"fragment_bytes", options.executor.fragment_bytes},
                   {"serial", options.executor.serial},
                   {"arena_mb", absl::GetFlag(FLAGS_arena_mb)},
                   {"link_gbps", device_options.link_gbps},
                   {"link_latency_us", device_options.link_latency_us},
                   {"blas_threads", options.blas_threads},
                   {"optimizer_threads", options.optimizer_threads},
                   {"steps", steps},
                   {"warmup", warmup}};
  out["parameters"] = t.layout().parameter_count();
  out["layer_weight_bytes"] = layer_elements * int64_t{sizeof(float)};
  out["layer_ring_bytes"] = layer_ring_bytes;
  out["fragments_per_step"] = t.executor().step_fragment_count();
  out["device_weight_bytes"] = t.executor().plan().weight_slots;  // slots or ring
  out["device_plan_bytes"] = t.executor().plan().total();  // predicted; arena_peak_bytes measured
  out["tokens_per_step"] = tokens * micro_batches;
  out["step_seconds"] = step_s;  // median wall time between Step() returns
  out["tokens_per_second"] = static_cast<double>(tokens * micro_batches) / step_s;
  out["forward_backward_seconds"] = Median(fb);
  out["update_wait_seconds"] = Median(update_wait);
  out["optimizer_seconds"] = Median(optimizer);  // the AdamW pass (NVMe reads/writes included)
  out["states_on_nvme"] = t.store().state_store() != nullptr;
  // What the NVMe tier really moved per optimizer pass (every step ran one,
  // warm-up included): entries still in a staging slot are not re-read, so a
  // model with few entries may move much less than 16 bytes per parameter.
  const auto* nvme = t.store().state_store();
  const double passes = static_cast<double>(warmup + steps);
  out["nvme_bytes_per_step"] =
      nvme != nullptr
          ? static_cast<double>(nvme->stats().bytes_read + nvme->stats().bytes_written) / passes
          : 0.0;
  out["nvme_staging_hits_per_step"] =
      nvme != nullptr ? static_cast<double>(nvme->stats().staging_hits) / passes : 0.0;
  out["stall_seconds"] = stall_s;
  out["stall_fraction"] = stall_s / step_s;
  out["copy_in_seconds"] = Median(copy_in);
  out["layer_forward_seconds"] = Median(layer_fwd);
  out["layer_backward_seconds"] = Median(layer_bwd);
  out["layer_recompute_seconds"] = Median(layer_rec);
  out["head_seconds"] = Median(head);
  out["weight_copies_per_layer"] = Median(copies);
  out["arena_peak_bytes"] = arena_peak;
  out["activation_policy"] = absl::GetFlag(FLAGS_activation_policy);
  out["activation_budget_bytes"] = options.executor.activation_budget_bytes;
  out["activation_plan_bytes"] = t.executor().plan().activations;
  // One saved-activation set (the default plan holds k of them).
  out["activation_set_bytes"] = t.executor().activation_set_bytes();
  out["activation_modes"] = activation_modes;
  {
    nlohmann::json reasons = nlohmann::json::array();
    for (const engine::BlockDecision& b : t.executor().activation_decision().blocks) {
      reasons.push_back(b.reason);
    }
    out["activation_reasons"] = reasons;
  }
  out["vm_hwm_bytes"] = static_cast<int64_t>(ProcStatusBytes("VmHWM"));
  out["vm_rss_bytes"] = static_cast<int64_t>(ProcStatusBytes("VmRSS"));
  out["final_loss"] = last_loss;
  printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace megatrain::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::bench::Run();
}
