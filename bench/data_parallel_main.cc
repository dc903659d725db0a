// data_parallel_bench: optimizer steps of a Llama-shaped model on the CPU device, alone (one
// process, --accumulation micro-batches a step), on --devices CPU devices of one process (micro-
// batch m on device m % N, gradient turns; docs/scale_out.md "Several devices in one process") or
// as one rank of an mpirun job (each rank runs accumulation / ranks of them; gradients reduced in
// rank order). Rank 0 prints one JSON line per step (wall seconds of Trainer::Step, communication
// seconds and bytes this rank sent, and each of its devices' compute stall, gradient turn wait and
// link bytes) and a summary with the medians; then the planner's predicted scaling of
// Qwen2.5-7B on H100s next to the 4xH100 figure MegaTrain's code reports (docs/planning.md "Data
// parallelism"). Driven by bench/data_parallel.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/device/cpu_device.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/model/model_config.h"
#include "engine/planner/data_parallel.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/model_presets.h"
#include "engine/planner/planner.h"
#include "engine/train/trainer.h"

ABSL_FLAG(int, hidden, 256, "Model width.");
ABSL_FLAG(int, layers, 4, "Decoder layers.");
ABSL_FLAG(int, ffn, 688, "MLP width.");
ABSL_FLAG(int, heads, 4, "Attention heads (and KV heads).");
ABSL_FLAG(int, vocab, 4096, "Vocabulary.");
ABSL_FLAG(int, seq, 128, "Tokens per sequence.");
ABSL_FLAG(int, micro_batch, 2, "Sequences per micro-batch.");
ABSL_FLAG(int, accumulation, 2, "Micro-batches per optimizer step over all ranks.");
ABSL_FLAG(int, steps, 6, "Optimizer steps (the first is not in the medians).");
ABSL_FLAG(int, threads, 1, "BLAS threads per process.");
ABSL_FLAG(int, devices, 1,
          "CPU devices of this process (not under mpirun): --accumulation is split over them.");
ABSL_FLAG(std::string, gradient_reduction, "host",
          "With --devices > 1: host (gradient turns) or devices (each device sums its "
          "micro-batches, a rank-ordered reduce-scatter among the devices, 1/N out each).");
ABSL_FLAG(bool, planner_scaling, true,
          "Also print the planner's predicted H100 scaling next to MegaTrain's 4xH100 figure.");

namespace megatrain::engine {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// MegaTrain's code reports about this many model TFLOP/s on 4 H100s (issue 18, point 6).
constexpr double kMegaTrain4xH100Tflops = 1290;

// The planner's prediction at the published setting (docs/planning.md: Qwen2.5-7B, micro-batch
// 8 x 12, seq 1024, k=4): 4 and 8 devices in one node of each H100 profile, one JSON line each.
absl::Status PrintPlannerScaling() {
  absl::StatusOr<ModelConfig> model = planner::ModelPreset("qwen2.5-7b");
  if (!model.ok()) return model.status();
  planner::PlanInputs in;
  in.micro_batch = 8;
  in.seq = 1024;
  in.grad_accumulation = 12;
  for (const char* name : {"h100-sxm", "h100-pcie"}) {
    absl::StatusOr<planner::HardwareProfile> hw =
        planner::FindHardwareProfile(planner::BuiltinHardwareProfiles(), name);
    if (!hw.ok()) return hw.status();
    absl::StatusOr<planner::PlanResult> one = planner::Plan(*model, in, *hw);
    if (!one.ok()) return one.status();
    absl::StatusOr<std::vector<planner::DataParallelPrediction>> rows =
        planner::PredictScaling(*one, *hw, {{4, 1}, {8, 1}});
    if (!rows.ok()) return rows.status();
    std::printf(
        "{\"planner\": \"qwen2.5-7b 8x12x1024 on %s\", \"predicted_4_gpu_model_tflops\": %.0f, "
        "\"predicted_8_gpu_model_tflops\": %.0f, \"predicted_8_gpu_efficiency\": %.3f, "
        "\"predicted_8_gpu_bottleneck\": \"%s\", \"megatrain_reported_4xh100_tflops\": %.0f}\n",
        name, (*rows)[0].model_tflops, (*rows)[1].model_tflops, (*rows)[1].efficiency,
        (*rows)[1].bottleneck.c_str(), kMegaTrain4xH100Tflops);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  std::unique_ptr<dist::MpiCommunicator> mpi;
  if (dist::LaunchedByMpi()) {
    absl::StatusOr<std::unique_ptr<dist::MpiCommunicator>> c = dist::MpiCommunicator::Create();
    if (!c.ok()) return c.status();
    mpi = *std::move(c);
  }
  const int devices = absl::GetFlag(FLAGS_devices);
  if (devices < 1 || (devices > 1 && mpi != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices=", devices, ": at least 1, and several only in one process (not under mpirun)"));
  }
  if (absl::GetFlag(FLAGS_accumulation) % devices != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--accumulation=", absl::GetFlag(FLAGS_accumulation),
                     " is not a multiple of --devices=", devices));
  }
  const int world = mpi != nullptr ? mpi->size() : 1;
  const int rank = mpi != nullptr ? mpi->rank() : 0;
  const int accumulation = absl::GetFlag(FLAGS_accumulation);
  if (accumulation % world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--accumulation=", accumulation, " is not a multiple of ", world, " ranks"));
  }
  const int per_rank = accumulation / world;
  absl::StatusOr<ModelConfig> config = ParseModelConfig(absl::StrCat(
      R"({"model_type": "llama", "vocab_size": )", absl::GetFlag(FLAGS_vocab),
      R"(, "hidden_size": )", absl::GetFlag(FLAGS_hidden), R"(, "intermediate_size": )",
      absl::GetFlag(FLAGS_ffn), R"(, "num_hidden_layers": )", absl::GetFlag(FLAGS_layers),
      R"(, "num_attention_heads": )", absl::GetFlag(FLAGS_heads), R"(, "num_key_value_heads": )",
      absl::GetFlag(FLAGS_heads), R"(, "max_position_embeddings": )", absl::GetFlag(FLAGS_seq),
      R"(, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": false})"));
  if (!config.ok()) return config.status();
  DeviceOptions device_options;
  device_options.arena_bytes = size_t{1} << 30;
  device_options.pinned_budget_bytes = size_t{8} << 30;
  std::vector<std::unique_ptr<CpuDevice>> owned_devices;
  std::vector<Device*> device_list;
  for (int d = 0; d < devices; ++d) {
    absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(device_options);
    if (!device.ok()) return device.status();
    owned_devices.push_back(*std::move(device));
    device_list.push_back(owned_devices.back().get());
  }
  TrainerOptions o;
  o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch);
  o.seq_len = absl::GetFlag(FLAGS_seq);
  o.lr.total_steps = absl::GetFlag(FLAGS_steps);
  o.blas_threads = absl::GetFlag(FLAGS_threads);
  o.optimizer_threads = 1;
  // Each device's stall and turn wait come from its timeline (two clock reads per op), in every
  // run alike so the three ways compare.
  o.collect_timeline = true;
  o.communicator = mpi.get();
  absl::StatusOr<GradientReduction> reduction =
      ParseGradientReduction(absl::GetFlag(FLAGS_gradient_reduction));
  if (!reduction.ok()) return reduction.status();
  o.gradient_reduction = *reduction;
  if (*reduction != GradientReduction::kHost) {
    o.executor.gradient_accumulation = GradientAccumulation::kAuto;
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(device_list, *config, o);
  if (!trainer.ok()) return trainer.status();
  (*trainer)->InitializeRandom(1);

  const int64_t tokens = static_cast<int64_t>(o.micro_batch_size) * o.seq_len;
  std::vector<std::vector<int32_t>> data(static_cast<size_t>(per_rank),
                                         std::vector<int32_t>(tokens));
  std::vector<double> step_seconds, comm_seconds;
  const size_t lanes = static_cast<size_t>(devices);
  std::vector<std::vector<double>> stall_seconds(lanes), turn_wait_seconds(lanes),
      reduce_seconds(lanes);
  std::vector<uint64_t> link_bytes(static_cast<size_t>(devices), 0);
  uint64_t bytes = 0;
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    std::vector<const int32_t*> in, tg;
    for (int m = 0; m < per_rank; ++m) {
      for (int64_t t = 0; t < tokens; ++t) {
        data[m][t] = static_cast<int32_t>((t * 31 + (rank * per_rank + m) * 7 + step * 13) %
                                          absl::GetFlag(FLAGS_vocab));
      }
      in.push_back(data[m].data());
      tg.push_back(data[m].data());
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<StepReport> r = (*trainer)->Step(in, tg);
    if (!r.ok()) return r.status();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step > 0) {
      step_seconds.push_back(seconds);
      comm_seconds.push_back(r->communication_seconds);
    }
    bytes = r->communication_bytes;
    std::string per_device;  // [stall, turn wait, link bytes] of each of this process's devices
    for (size_t d = 0; d < r->devices.size(); ++d) {
      const DeviceStepFigures& f = r->devices[d];
      if (step > 0) {
        stall_seconds[d].push_back(f.stall_seconds);
        turn_wait_seconds[d].push_back(f.turn_wait_seconds);
        reduce_seconds[d].push_back(f.reduce_seconds);
      }
      link_bytes[d] = f.link_bytes;
      absl::StrAppend(&per_device, d == 0 ? ", \"devices\": [" : ", ",
                      absl::StrFormat("{\"stall_seconds\": %.4f, \"turn_wait_seconds\": %.4f, "
                                      "\"reduce_seconds\": %.4f, \"link_bytes\": %llu}",
                                      f.stall_seconds, f.turn_wait_seconds, f.reduce_seconds,
                                      static_cast<unsigned long long>(f.link_bytes)),
                      d + 1 == r->devices.size() ? "]" : "");
    }
    if (rank == 0) {
      std::printf(
          "{\"step\": %d, \"step_seconds\": %.4f, \"comm_seconds\": %.4f, "
          "\"comm_bytes\": %llu, \"loss\": %.6f%s}\n",
          step + 1, seconds, r->communication_seconds,
          static_cast<unsigned long long>(r->communication_bytes), r->loss, per_device.c_str());
    }
  }
  if (absl::Status s = (*trainer)->UpdateStatus(); !s.ok()) return s;
  if (rank == 0) {
    std::string per_device;
    for (size_t d = 0; d < link_bytes.size(); ++d) {
      absl::StrAppend(&per_device, d == 0 ? ", \"devices\": [" : ", ",
                      absl::StrFormat("{\"median_stall_seconds\": %.4f, "
                                      "\"median_turn_wait_seconds\": %.4f, "
                                      "\"median_reduce_seconds\": %.4f, "
                                      "\"link_bytes_per_step\": %llu}",
                                      Median(stall_seconds[d]), Median(turn_wait_seconds[d]),
                                      Median(reduce_seconds[d]),
                                      static_cast<unsigned long long>(link_bytes[d])),
                      d + 1 == link_bytes.size() ? "]" : "");
    }
    std::printf(
        "{\"ranks\": %d, \"devices\": %d, \"accumulation\": %d, \"parameters\": %lld, "
        "\"median_step_seconds\": %.4f, \"median_comm_seconds\": %.4f, "
        "\"comm_bytes_per_step\": %llu%s}\n",
        world, devices, accumulation,
        static_cast<long long>((*trainer)->layout().parameter_count()), Median(step_seconds),
        Median(comm_seconds), static_cast<unsigned long long>(bytes), per_device.c_str());
    if (absl::GetFlag(FLAGS_planner_scaling)) return PrintPlannerScaling();
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = megatrain::engine::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "data_parallel_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
