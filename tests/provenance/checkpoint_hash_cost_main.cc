// Measures what provenance records cost per checkpoint: the same trainer's
// checkpoint written with (SHA-256 of every file and tensor while streaming,
// provenance.json, provenance.sig) and without them, alternately, median of N.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/device/cpu_device.h"
#include "engine/provenance/record.h"
#include "engine/provenance/signing_key.h"
#include "engine/train/training_run.h"
#include "engine/train/trainer.h"

ABSL_FLAG(std::string, dir, "/tmp/megatrain-hash-cost", "Scratch checkpoint root (removed).");
ABSL_FLAG(int, repeats, 5, "Checkpoints written per mode.");
ABSL_FLAG(int, layers, 6, "Layers of the tiny text model (about 1.6M parameters per layer).");

namespace megatrain::engine {
namespace {

// CPU time of the calling thread: the writer's own work, free of disk noise.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  DeviceOptions device_options;
  device_options.arena_bytes = int64_t{256} << 20;
  device_options.pinned_budget_bytes = int64_t{1} << 30;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(device_options);
  if (!device.ok()) return 1;
  ModelConfig config = TinyTextModelConfig();
  config.num_hidden_layers = absl::GetFlag(FLAGS_layers);
  TrainerOptions t;
  t.micro_batch_size = 1;
  t.seq_len = 16;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(**device, config, t);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    return 1;
  }
  (*trainer)->InitializeRandom(1);
  absl::StatusOr<provenance::SigningKey> key = provenance::SigningKey::Generate();
  if (!key.ok()) return 1;
  auto context = std::make_shared<provenance::ProvenanceContext>();
  context->origin = provenance::RandomInitOrigin(1);
  context->signer = std::make_shared<const provenance::SigningKey>(*std::move(key));

  const std::string root = absl::GetFlag(FLAGS_dir);
  std::vector<double> with, without, with_cpu, without_cpu;
  uint64_t bytes = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    // Alternating which mode goes first, so neither always follows the other's deletion.
    for (bool record : {i % 2 == 0, i % 2 != 0}) {
      std::filesystem::remove_all(root);
      CheckpointRunInfo run;
      run.provenance = context;
      CheckpointOptions options;
      options.record_provenance = record;
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = ThreadCpuSeconds();
      absl::StatusOr<std::string> path = WriteCheckpoint(**trainer, root, run, options);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double cpu_seconds = ThreadCpuSeconds() - cpu_start;
      if (!path.ok()) {
        std::fprintf(stderr, "%s\n", std::string(path.status().message()).c_str());
        return 1;
      }
      bytes = 0;
      for (const auto& f : std::filesystem::directory_iterator(*path)) bytes += f.file_size();
      (record ? with : without).push_back(seconds);
      (record ? with_cpu : without_cpu).push_back(cpu_seconds);
    }
  }
  std::filesystem::remove_all(root);
  const double a = Median(with), b = Median(without);
  const double ca = Median(with_cpu), cb = Median(without_cpu);
  std::printf(
      "parameters %lld, checkpoint %.1f MB, median of %zu:\n"
      "  wall: with provenance %.3f s, without %.3f s, difference %+.3f s\n"
      "  writer-thread CPU: with %.3f s, without %.3f s, difference %+.3f s (%.0f MB/s of "
      "checkpoint)\n",
      static_cast<long long>((*trainer)->layout().parameter_count()), bytes / 1e6, with.size(), a,
      b, a - b, ca, cb, ca - cb, ca > cb ? bytes / 1e6 / (ca - cb) : 0.0);
  return 0;
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::engine::Main();
}
