// JobEngine: what the runner thread calls to execute one validated job; an interface so tests
// can run the daemon with a fake (blocking, failing, device-faulting) engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/device/cpu_device.h"
#include "engine/device/device.h"
#include "engine/train/training_run.h"
#include "server/hosts_job.h"
#include "server/job_tokens.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {

// One device as the daemon's status reports it (v1::DeviceStatus).
struct DeviceState {
  std::string name;
  engine::ArenaStats arena;
  absl::Status health;  // OK, or the device's sticky fault
};

class JobEngine {
 public:
  virtual ~JobEngine() = default;
  // Runs `job` to its end on the runner thread, reporting through `observer`; returns CANCELLED
  // when observer.ShouldStop() stopped it, the engine's error otherwise.
  virtual absl::Status Run(const std::string& job_id, const service::ValidatedJob& job,
                           engine::TrainingObserver& observer) = 0;
  // The health of the device the engine runs jobs on: OK, or its sticky fault (the daemon then
  // stops taking jobs until it is restarted).
  virtual absl::Status DeviceHealth() const { return absl::OkStatus(); }
  // Each device the engine drives, in index order (empty for an engine without devices, e.g. a
  // test's fake). Safe to call from any thread while a job runs.
  virtual std::vector<DeviceState> Devices() const { return {}; }
};

// A device fault (CUDA sticky error, injected CPU fault): the device is unusable until restart.
bool IsDeviceFault(const absl::Status& status);

// Where a job's checkpoints live: <output_dir>/checkpoints, <output_dir>/checkpoints/<id> for a
// job that reuses a finished job's output directory (its retention never sees the other job's
// checkpoints, and it never resumes from them), or <state_dir>/jobs/<id>/checkpoints for a job
// without an output directory.
std::string JobCheckpointDir(const std::string& state_dir, const std::string& job_id,
                             const service::ValidatedJob& job);

// Where a job's token files live: <output_dir>/tokens, or <state_dir>/jobs/<id>/tokens.
std::string JobTokensDir(const std::string& state_dir, const std::string& job_id,
                         const service::ValidatedJob& job);

struct DeviceJobEngineOptions {
  std::string state_dir;
  engine::DeviceOptions device;  // the daemon's devices' options, each created once
  // Devices the daemon drives (DaemonSettings::devices): the CPU device that many times, CUDA
  // ordinals device.cuda_device_ordinal onwards. A job trains on the first JobSpec.devices.
  uint32_t devices = 1;
  // Test hook, CPU device only: CpuDevice::InjectFault after this many training steps of the
  // engine's lifetime (over all jobs); 0 = never. megatraind's --inject_device_fault_after_steps.
  uint64_t inject_device_fault_after_steps = 0;
  // megatrain_tokenize, run for jobs with a SentencePiece data.tokenizer; empty = the one beside
  // the running executable (DefaultTokenizeBinary). megatraind's --tokenize_binary.
  std::string tokenize_binary;
  // megatrain_chat_tokenize (tools/hf_chat), run for jobs with data.chat_files; empty = the one
  // beside the running executable (DefaultChatTokenizeBinary). megatraind's
  // --chat_tokenize_binary.
  std::string chat_tokenize_binary;
  // Jobs with JobSpec.hosts: how their ranks are launched (server/hosts_job.h).
  HostsLaunch hosts_launch;
};

// The real engine: owns the daemon's one device for its lifetime and runs each job with
// engine::RunTraining on it (jobs run one at a time), with checkpoints per the job's
// CheckpointPolicy under JobCheckpointDir and resume on (a restarted or resumed job continues
// from its newest checkpoint); writes <output_dir>/result.json when the job names an output
// directory. A job whose text uses a SentencePiece model is first tokenized by
// megatrain_tokenize in a child process (server/job_tokens.h) into JobTokensDir, killed when the
// job is stopped, and trains on that token file; a job with chat files likewise by
// megatrain_chat_tokenize into an MTSFT sample file (server/job_chat_samples.h). A job with
// JobSpec.hosts is prepared the same way, then runs as ranks on its machines (server/hosts_job.h)
// instead of on the daemon's devices. A device fault fails the running job and every later one
// (DeviceHealth).
class DeviceJobEngine final : public JobEngine {
 public:
  // Creates the device; INVALID_ARGUMENT for a fault hook on a non-CPU device.
  static absl::StatusOr<std::unique_ptr<DeviceJobEngine>> Create(DeviceJobEngineOptions options);

  absl::Status Run(const std::string& job_id, const service::ValidatedJob& job,
                   engine::TrainingObserver& observer) override;
  // The first unhealthy device's fault (OK when all are healthy).
  absl::Status DeviceHealth() const override;
  std::vector<DeviceState> Devices() const override;
  engine::Device& device() { return *device_; }

 private:
  class FaultHookObserver;
  // The token file of a SentencePiece job (reused when an earlier run made it).
  absl::StatusOr<JobTokens> TokenizeText(const std::string& job_id,
                                         const service::ValidatedJob& job,
                                         engine::TrainingObserver& observer);
  // Tokenizes a chat job's files into its sample file (reused when an earlier run made it) and
  // points options.sft_sample_paths at the job's stable link to it, held in `held`.
  absl::Status PrepareChatData(const std::string& job_id, const service::ValidatedJob& job,
                               engine::TrainingObserver& observer,
                               engine::TrainingRunOptions& options, engine::InputFiles& held);
  DeviceJobEngine(DeviceJobEngineOptions options, std::unique_ptr<engine::Device> device,
                  engine::CpuDevice* cpu_device,
                  std::vector<std::unique_ptr<engine::Device>> more_devices)
      : options_(std::move(options)),
        device_(std::move(device)),
        more_devices_(std::move(more_devices)),
        cpu_device_(cpu_device) {}

  const DeviceJobEngineOptions options_;
  const std::unique_ptr<engine::Device> device_;
  // Devices 1.. of options_.devices (several devices in one process, docs/scale_out.md).
  const std::vector<std::unique_ptr<engine::Device>> more_devices_;
  engine::CpuDevice* const cpu_device_;  // device_ when it is the CPU device, else null
  uint64_t steps_run_ = 0;               // runner thread only
};

}  // namespace megatrain::server
