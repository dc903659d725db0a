// Running and predicting planner-accuracy cases.
#include "tests/planner/accuracy_case.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include "engine/common/proc_status.h"

namespace megatrain::engine::planner {
namespace {

constexpr uint64_t kArenaBytes = uint64_t{512} << 20;  // untouched pages cost no RAM

PlanInputs FullInputs(const AccuracyCase& c, const std::string& nvme_dir) {
  PlanInputs in = c.inputs;
  in.device_arena_bytes = kArenaBytes;
  if (c.nvme) {
    in.budgets_enabled = true;
    in.states_on_nvme = true;
    in.budgets.pinned_ram = uint64_t{4} << 30;
    in.budgets.ram = uint64_t{4} << 30;
    in.budgets.nvme_dir = nvme_dir;
    in.budgets.nvme_bytes = uint64_t{4} << 30;
  }
  return in;
}

testing::TinyShape Shape(int layers, int hidden, int ffn, int heads, int kv, int vocab) {
  testing::TinyShape s;
  s.layers = layers;
  s.hidden = hidden;
  s.ffn = ffn;
  s.heads = heads;
  s.kv_heads = kv;
  s.vocab = vocab;
  return s;
}

}  // namespace

HardwareProfile WithLink(HardwareProfile local, double link_gbps) {
  local.h2d_gbps = link_gbps;
  local.d2h_gbps = link_gbps;
  return local;
}

std::vector<AccuracyCase> StandardCases() {
  std::vector<AccuracyCase> cases;
  auto add = [&](std::string name, testing::TinyShape shape, int mb, int seq, int k, double link) {
    AccuracyCase c;
    c.name = std::move(name);
    c.shape = shape;
    c.inputs.micro_batch = mb;
    c.inputs.seq = seq;
    c.inputs.checkpoint_interval = k;
    c.link_gbps = link;
    cases.push_back(c);
    return &cases.back();
  };
  const testing::TinyShape base = Shape(8, 256, 688, 4, 2, 512);
  add("calibration: 8x256, b4 s64, k4, unthrottled", base, 4, 64, 4, 0);
  add("8x256, k2, link 1 GB/s (copy-bound)", base, 4, 64, 2, 1.0);
  add("8x256, k4, link 4 GB/s", base, 4, 64, 4, 4.0);
  add("8x256, keep_all", base, 4, 64, 4, 0)->inputs.keep_all = true;
  add("8x256, 2 micro-batches", base, 4, 64, 4, 0)->inputs.grad_accumulation = 2;
  add("6x384 GQA 6/2, b2 s128, k2", Shape(6, 384, 1024, 6, 2, 1000), 2, 128, 2, 0);
  add("4x512, b2 s128, k1, link 2 GB/s", Shape(4, 512, 1376, 8, 8, 2000), 2, 128, 1, 2.0);
  AccuracyCase* all_resident = add("8x256, weight_slots auto, link 1 GB/s", base, 4, 64, 4, 1.0);
  all_resident->inputs.weight_slots = 0;
  add("8x256, m/v on NVMe", base, 4, 64, 4, 0)->nvme = true;
  add("12x192, b8 s32, k3, host checkpoints", Shape(12, 192, 512, 4, 4, 300), 8, 32, 3, 0)
      ->inputs.device_checkpoints = 0;
  return cases;
}

absl::StatusOr<PlanResult> PredictCase(const AccuracyCase& c, const HardwareProfile& local,
                                       const std::string& nvme_dir) {
  HardwareProfile hw = WithLink(local, c.link_gbps);
  hw.device_memory_bytes = kArenaBytes;
  return Plan(testing::TinyConfig(c.shape), FullInputs(c, nvme_dir), hw);
}

absl::StatusOr<Measured> RunCase(const AccuracyCase& c, int warmup, int steps,
                                 const std::string& nvme_dir) {
  const PlanInputs in = FullInputs(c, nvme_dir);
  TrainerOptions o;
  o.micro_batch_size = in.micro_batch;
  o.seq_len = in.seq;
  o.head_chunk = in.head_chunk;
  o.lr.total_steps = warmup + steps + 1;
  o.executor.checkpoint_interval = in.checkpoint_interval;
  o.executor.keep_all = in.keep_all;
  o.executor.weight_slots = in.weight_slots;
  o.executor.device_checkpoints = in.device_checkpoints;
  o.collect_timeline = false;
  if (in.budgets_enabled) {
    o.memory.enabled = true;
    o.memory.budgets = in.budgets;
    o.memory.states_on_nvme = in.states_on_nvme;
  }
  const int vocab = c.shape.vocab;
  const int tokens = in.micro_batch * in.seq;
  const int total_mb = (warmup + steps) * in.grad_accumulation;
  const auto batches = testing::MakeTokenBatches(total_mb, tokens, vocab, 7);

  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const uint64_t baseline = ProcStatusBytes("VmRSS");
  Measured out;
  {
    auto device = testing::MakeCpuDevice(kArenaBytes, c.link_gbps);
    auto trainer = Trainer::Create(*device, testing::TinyConfig(c.shape), o);
    if (!trainer.ok()) return trainer.status();
    (*trainer)->InitializeRandom(3);
    std::vector<double> seconds;
    for (int s = 0; s < warmup + steps; ++s) {
      const int first = s * in.grad_accumulation;
      const auto t0 = std::chrono::steady_clock::now();
      auto r = (*trainer)->Step(batches.InputPointers(first, in.grad_accumulation),
                                batches.TargetPointers(first, in.grad_accumulation));
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!r.ok()) return r.status();
      if (s >= warmup) seconds.push_back(dt);
      out.arena_peak = std::max<uint64_t>(out.arena_peak, r->device_arena_peak_bytes);
    }
    if (absl::Status s = (*trainer)->UpdateStatus(); !s.ok()) return s;
    out.vmhwm_growth = ProcStatusBytes("VmHWM") - baseline;
    std::sort(seconds.begin(), seconds.end());
    out.step_seconds = seconds[seconds.size() / 2];
  }
  return out;
}

}  // namespace megatrain::engine::planner
