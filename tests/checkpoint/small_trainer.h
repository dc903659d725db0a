// Test helper: the small llama (vocab 53, 2 layers) the checkpoint tests train, on a CPU device,
// and a snapshot of every master, m and v float of a trainer's store.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device/cpu_device.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace megatrain::engine {

// <TempDir>/<current test's name>, emptied.
inline std::string FreshCheckpointRoot() {
  const std::string root =
      absl::StrCat(::testing::TempDir(), "/",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(root);
  return root;
}

inline ModelConfig SmallCheckpointConfig(bool tied) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(absl::StrCat(
      R"({"model_type": "llama", "vocab_size": 53, "hidden_size": 24, "intermediate_size": 40,
          "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": )",
      tied ? "true" : "false", "}"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

inline std::unique_ptr<CpuDevice> SmallCheckpointDevice() {
  DeviceOptions o;
  o.arena_bytes = 32 << 20;
  o.pinned_budget_bytes = 256 << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(o);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

// Sequence 11, micro-batch 1, one BLAS and optimizer thread; weights from `seed`.
inline std::unique_ptr<Trainer> MakeSmallTrainer(Device& device, bool tied, uint64_t seed) {
  TrainerOptions o;
  o.micro_batch_size = 1;
  o.seq_len = 11;
  o.lr.peak_lr = 1e-2;
  o.lr.total_steps = 10;
  o.blas_threads = 1;
  o.optimizer_threads = 1;
  o.collect_timeline = false;
  absl::StatusOr<std::unique_ptr<Trainer>> t =
      Trainer::Create(device, SmallCheckpointConfig(tied), o);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  (*t)->InitializeRandom(seed);
  return std::move(*t);
}

// Every master, m and v float of the store, after the pending updates.
inline std::vector<float> StoreSnapshot(Trainer& t) {
  t.WaitForUpdates();
  std::vector<float> out;
  for (int e = 0; e < t.mutable_store().num_entries(); ++e) {
    const EntryBuffers b = t.mutable_store().entry(e);
    for (const float* p : {b.master, b.m, b.v}) out.insert(out.end(), p, p + b.elements);
  }
  return out;
}

}  // namespace megatrain::engine
