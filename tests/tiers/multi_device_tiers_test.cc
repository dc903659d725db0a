// Several CPU devices of one process with the gradients on NVMe (docs/scale_out.md "Several
// devices in one process"): each entry's chunks are begun, added to and ended within its gradient
// turn, so 2 and 3 devices end at the bits of one device with every array in RAM -- layers of
// several chunks, the fragmented head writing a chunk block by block, the embedding's gradient
// kept in RAM beside the others on NVMe.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/tiers/test_dir.h"
#include "tests/tiers/tiered_training.h"

namespace megatrain::engine {
namespace {

using namespace tiered_training;  // NOLINT: the shared fixtures of this folder

constexpr int kSteps = 3;
// The gradient norm's 64 Ki elements: a decoder layer of DeepNarrow is three chunks.
constexpr size_t kSmallChunk = size_t{256} << 10;

struct DeviceRun {
  std::vector<double> losses, norms;
  Outcome state;
};

DeviceRun Train(int devices, int accumulation, const TrainerOptions& o) {
  DeviceRun run;
  const CpuDevices owned = MakeCpuDevices(devices);
  auto trainer = Trainer::Create(owned.pointers, TinyConfig(DeepNarrow()), o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return run;
  (*trainer)->InitializeRandom(3);
  const auto batches = MakeTokenBatches(accumulation * kSteps, 48, DeepNarrow().vocab, 17);
  for (int step = 0; step < kSteps; ++step) {
    auto r = (*trainer)->Step(batches.InputPointers(accumulation * step, accumulation),
                              batches.TargetPointers(accumulation * step, accumulation));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return run;
    run.losses.push_back(r->loss);
    run.norms.push_back(r->grad_norm);
  }
  EXPECT_TRUE((*trainer)->UpdateStatus().ok());
  ReadStore((*trainer)->store(), &run.state);
  auto gradient = (*trainer)->ReadGradient(kProbeTensor);
  EXPECT_TRUE(gradient.ok()) << gradient.status();
  if (gradient.ok()) run.state.probe_gradient = *gradient;
  return run;
}

void ExpectBitwise(const DeviceRun& in_ram, const DeviceRun& tiered, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_EQ(tiered.losses.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(std::memcmp(&in_ram.losses[s], &tiered.losses[s], sizeof(double)), 0) << s;
    EXPECT_EQ(std::memcmp(&in_ram.norms[s], &tiered.norms[s], sizeof(double)), 0) << s;
  }
  ExpectSameState(in_ram.state, tiered.state);
  ASSERT_EQ(in_ram.state.probe_gradient.size(), tiered.state.probe_gradient.size());
  EXPECT_EQ(std::memcmp(in_ram.state.probe_gradient.data(), tiered.state.probe_gradient.data(),
                        in_ram.state.probe_gradient.size() * sizeof(float)),
            0);
}

TrainerOptions GradientsOnNvme(const std::string& dir, bool fragmented) {
  TrainerOptions o = TieredOptions(1);
  o.memory.grad_on_nvme = true;
  o.memory.nvme_chunk_bytes = kSmallChunk;
  o.memory.budgets.nvme_dir = dir;
  if (fragmented) {
    o.executor.weight_slots = 0;
    o.executor.weight_ring_bytes = size_t{2} << 20;
    o.executor.fragment_bytes = 40000;
    o.head_block_rows = 11;  // 9 vocabulary blocks: the head's chunk is written block by block
  }
  return o;
}

TEST(MultiDeviceTiersTest, GradientsOnNvmeEqualOneDeviceInRam) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("multi_device_nvme", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  for (bool fragmented : {false, true}) {
    TrainerOptions in_ram_options = BaseOptions();
    in_ram_options.lr.total_steps = kSteps;
    TrainerOptions nvme_options = GradientsOnNvme(dir, fragmented);
    nvme_options.lr.total_steps = kSteps;
    if (fragmented) in_ram_options.head_block_rows = 11;
    const std::string mode = fragmented ? "ring" : "slots";
    {
      // The placement: the layers' gradients on NVMe, the embedding's in RAM.
      auto d0 = MakeCpuDevice(size_t{32} << 20);
      auto d1 = MakeCpuDevice(size_t{32} << 20);
      auto trainer = Trainer::Create({d0.get(), d1.get()}, TinyConfig(DeepNarrow()), nvme_options);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      const ParameterStore& store = (*trainer)->store();
      EXPECT_TRUE(store.grad_on_nvme((*trainer)->layout().layer_entry(3)));
      EXPECT_TRUE(store.grad_on_nvme((*trainer)->layout().lm_head_entry()));
      EXPECT_FALSE(store.grad_on_nvme((*trainer)->layout().embedding_entry()));
      EXPECT_EQ((*trainer)->executor().fragment_mode(), fragmented);
    }
    for (auto [devices, accumulation] : {std::pair{2, 2}, {3, 6}}) {
      const DeviceRun in_ram = Train(1, accumulation, in_ram_options);
      const DeviceRun tiered = Train(devices, accumulation, nvme_options);
      ExpectBitwise(in_ram, tiered,
                    absl::StrCat(mode, ", ", devices, " devices, accumulation ", accumulation));
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
