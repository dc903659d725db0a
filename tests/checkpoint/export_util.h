// Shared by the export test and the export sample tool: loads a golden
// fixture (tests/golden/<name>) into a trainer on the CPU device with the
// fixture's hyperparameters, and runs its training steps.
#pragma once

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device/cpu_device.h"
#include "engine/model/safetensors_reader.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine::testing {

struct GoldenRun {
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<Trainer> trainer;
  std::vector<int32_t> input_ids;  // [steps, micro, batch, seq]
  std::vector<int32_t> targets;
  std::vector<float> initial_logits;  // committed: step 0, micro-batch 0
  int steps = 0, micro = 0, batch = 0, seq = 0;
};

inline absl::StatusOr<std::vector<int32_t>> ReadInt32(const SafetensorsFile& f, const char* name) {
  auto bytes = f.RawBytes(name);
  if (!bytes.ok()) return bytes.status();
  std::vector<int32_t> out(bytes->size() / sizeof(int32_t));
  std::memcpy(out.data(), bytes->data(), out.size() * sizeof(int32_t));
  return out;
}

inline absl::StatusOr<GoldenRun> LoadGolden(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json meta = nlohmann::json::parse(ss.str(), nullptr, false);
  if (!meta.is_object()) return absl::NotFoundError(absl::StrCat(dir, "/golden.json unreadable"));
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  if (!golden.ok()) return golden.status();
  auto config = LoadModelConfig(dir + "/config.json");
  if (!config.ok()) return config.status();

  GoldenRun r;
  r.steps = meta["steps"];
  r.micro = meta["micro"];
  r.batch = meta["batch"];
  r.seq = meta["seq"];
  DeviceOptions d;
  d.arena_bytes = 64 << 20;
  d.pinned_budget_bytes = 256 << 20;
  auto device = CpuDevice::Create(d);
  if (!device.ok()) return device.status();
  r.device = std::move(*device);
  const std::vector<double> lrs = meta["lr"].get<std::vector<double>>();
  TrainerOptions o;
  o.micro_batch_size = r.batch;
  o.seq_len = r.seq;
  o.head_chunk = 7;
  o.lr.peak_lr = lrs.back();
  o.lr.warmup_steps = lrs.size();
  o.lr.cosine = false;
  o.lr.total_steps = r.steps;
  o.beta1 = meta["betas"][0];
  o.beta2 = meta["betas"][1];
  o.eps = meta["eps"];
  o.weight_decay = meta["weight_decay"]["decay"];
  o.grad_clip = meta["max_norm"];
  auto trainer = Trainer::Create(*r.device, *config, o);
  if (!trainer.ok()) return trainer.status();
  r.trainer = std::move(*trainer);
  if (absl::Status s = r.trainer->LoadHfWeights(dir); !s.ok()) return s;
  auto ids = ReadInt32(*golden, "input_ids");
  if (!ids.ok()) return ids.status();
  r.input_ids = std::move(*ids);
  auto targets = ReadInt32(*golden, "targets");
  if (!targets.ok()) return targets.status();
  r.targets = std::move(*targets);
  const SafetensorsTensorInfo* logits = golden->Find("logits_step0_micro0");
  if (logits == nullptr) return absl::NotFoundError("logits_step0_micro0");
  r.initial_logits.resize(logits->num_elements);
  if (absl::Status s = golden->ReadFloat32("logits_step0_micro0", absl::MakeSpan(r.initial_logits));
      !s.ok()) {
    return s;
  }
  return r;
}

inline absl::Status TrainGoldenSteps(GoldenRun& r) {
  const size_t tokens = static_cast<size_t>(r.batch) * r.seq;
  for (int s = 0; s < r.steps; ++s) {
    std::vector<const int32_t*> in, tg;
    for (int m = 0; m < r.micro; ++m) {
      in.push_back(r.input_ids.data() + (static_cast<size_t>(s) * r.micro + m) * tokens);
      tg.push_back(r.targets.data() + (static_cast<size_t>(s) * r.micro + m) * tokens);
    }
    auto report = r.trainer->Step(in, tg);
    if (!report.ok()) return report.status();
  }
  r.trainer->WaitForUpdates();
  return absl::OkStatus();
}

}  // namespace megatrain::engine::testing
