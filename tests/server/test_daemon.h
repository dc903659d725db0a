// In-process megatraind for tests: a Daemon on a short Unix socket path with a fake engine that
// steps until stopped (or faults on request) or a real one, plus a temp data/output tree.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/megatrain.grpc.pb.h"
#include "server/daemon.h"

namespace megatrain::server::testing {

// Steps until asked to stop (or `steps`, whichever first); a fault request fails the run with a
// device fault at the next step, as a sticky device error would.
class SteppingFakeEngine final : public JobEngine {
 public:
  absl::Status Run(const std::string&, const service::ValidatedJob& job,
                   engine::TrainingObserver& observer) override {
    for (uint64_t step = 1; step <= job.options.steps; ++step) {
      if (observer.ShouldStop()) return absl::CancelledError("stopped");
      if (fault_) return absl::InternalError("device fault: injected by the test");
      engine::StepReport report;
      report.step = step;
      report.loss = 3.0;
      report.tokens = 64;
      report.layers.resize(3);
      observer.OnStep(report, 3.0);
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(2), [&] { return fault_.load(); });
    }
    return absl::OkStatus();
  }
  void InjectFault() {
    fault_ = true;
    wake_.notify_all();
  }

 private:
  std::atomic<bool> fault_{false};
  std::mutex mu_;
  std::condition_variable wake_;
};

class TestDaemon {
 public:
  explicit TestDaemon(const std::string& tag) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::string(tmp ? tmp : "/tmp") + "/" + tag;
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data");
    std::filesystem::create_directories(root_ + "/out");
    std::ofstream(root_ + "/data/config.json")
        << R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 48,
              "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256})";
    std::ofstream(root_ + "/data/corpus.txt") << "one fortune\n%\nanother fortune\n%\n";
    char sock_template[] = "/tmp/mt-test.XXXXXX";
    sock_dir_ = mkdtemp(sock_template);
    settings_.state_dir = root_ + "/state";
    settings_.socket_path = sock_dir_ + "/s.sock";
    settings_.data_roots = {root_ + "/data"};
    settings_.output_roots = {root_ + "/out"};
    settings_.device.arena_bytes = 64 << 20;
    settings_.device.pinned_budget_bytes = size_t{1} << 30;
    settings_.max_parameters = 50'000'000;
    settings_.shutdown_timeout_seconds = 20;
  }
  ~TestDaemon() {
    daemon_.reset();
    std::filesystem::remove_all(sock_dir_);
  }

  // Runs jobs on `engine` (a real DeviceJobEngine, say) instead of the fake one.
  void Start(JobEngine* engine = nullptr) {
    absl::StatusOr<std::unique_ptr<Daemon>> d =
        Daemon::Start(settings_, engine != nullptr ? *engine : engine_, log_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    channel_ =
        grpc::CreateChannel("unix:" + settings_.socket_path, grpc::InsecureChannelCredentials());
    stub_ = v1::Trainer::NewStub(channel_);
  }

  v1::JobSpec ValidSpec(uint64_t steps) const {
    v1::JobSpec spec;
    spec.set_name("test");
    spec.mutable_model()->set_config_json_path(root_ + "/data/config.json");
    spec.mutable_data()->add_text_files(root_ + "/data/corpus.txt");
    spec.mutable_hyper()->set_steps(steps);
    spec.mutable_hyper()->set_batch_size(2);
    spec.mutable_hyper()->set_seq_len(32);
    spec.mutable_hyper()->mutable_lr()->set_peak_lr(1e-3);
    // Each job needs its own output directory (it holds the job's checkpoints).
    spec.set_output_dir(root_ + "/out/job" + std::to_string(next_output_++));
    return spec;
  }

  // Bounded wait (via WatchJob) until the job has reached `state` with at least `min_step`.
  v1::Job AwaitState(const std::string& id, v1::JobState state, uint64_t min_step = 0,
                     int timeout_seconds = 30) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_seconds));
    v1::WatchJobRequest request;
    request.set_id(id);
    auto reader = stub_->WatchJob(&context, request);
    v1::ProgressEvent event;
    while (reader->Read(&event)) {
      if (event.state() == state && event.progress().step() >= min_step) {
        context.TryCancel();
        break;
      }
    }
    reader->Finish();
    v1::Job job;
    grpc::ClientContext get_context;
    v1::GetJobRequest get;
    get.set_id(id);
    EXPECT_TRUE(stub_->GetJob(&get_context, get, &job).ok());
    EXPECT_EQ(job.state(), state) << job.DebugString();
    return job;
  }

  // Stops the daemon (a clean shutdown) and starts it again on the same state directory (with
  // `engine` as Start takes it).
  void Restart(JobEngine* engine = nullptr) {
    stub_.reset();
    channel_.reset();
    daemon_.reset();
    Start(engine);
  }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  const std::string& root() const { return root_; }
  service::DaemonSettings& settings() { return settings_; }
  SteppingFakeEngine& engine() { return engine_; }
  Daemon& daemon() { return *daemon_; }
  v1::Trainer::Stub& stub() { return *stub_; }

 private:
  std::string root_;
  mutable int next_output_ = 0;
  std::string sock_dir_;
  service::DaemonSettings settings_;
  SteppingFakeEngine engine_;
  StructuredLog log_{stderr};
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Trainer::Stub> stub_;
};

}  // namespace megatrain::server::testing
