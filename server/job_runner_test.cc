// Tests of the job runner with a fake engine: FIFO order, cancel, device fault, restart, shutdown,
// lineage, the data check before a continued run, the audit log and held eval-reply events.
#include "server/job_runner.h"

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/resumable_failure.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

// Steps `steps` times, or (blocking) until asked to stop; may fail with a device fault. Keeps
// "checkpoints" per job in memory the way the real engine keeps them on disk: a run continues
// after the job's newest one.
class FakeEngine final : public JobEngine {
 public:
  absl::Status Run(const std::string& job_id, const service::ValidatedJob& job,
                   engine::TrainingObserver& observer) override {
    uint64_t first_step = 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_.push_back(job_id);
      first_step = checkpoint_step_[job_id] + 1;
    }
    auto checkpoint = [&](uint64_t step) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        checkpoint_step_[job_id] = step;
      }
      observer.OnCheckpoint(step, "/ckpt/" + job_id + "/step-" + std::to_string(step));
    };
    for (uint64_t step = first_step; step <= job.options.steps || blocking_; ++step) {
      if (observer.ShouldStop()) {
        if (step > first_step && observer.CheckpointBeforeStop()) checkpoint(step - 1);
        return absl::CancelledError("stopped");
      }
      engine::StepReport report;
      report.step = step;
      report.loss = 5.0 / static_cast<double>(step);
      report.tokens = 10;
      report.layers.resize(2);
      if (observer.ShouldCheckpoint()) checkpoint(step);
      if (eval_replies_per_step_ > 0) {
        std::vector<engine::EvalReplyReport> replies(static_cast<size_t>(eval_replies_per_step_));
        for (int i = 0; i < eval_replies_per_step_; ++i) {
          replies[static_cast<size_t>(i)].index = i;
          replies[static_cast<size_t>(i)].prompt = "prompt " + std::to_string(i);
          replies[static_cast<size_t>(i)].text = "reply " + std::to_string(step);
          replies[static_cast<size_t>(i)].ids = {1, 2};
          replies[static_cast<size_t>(i)].stopped = true;
        }
        observer.OnEvalReplies(step, replies);
      }
      observer.OnStep(report, 4.0);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++steps_;
      }
      wake_.notify_all();
      if (fault_at_ == step) {
        return fault_.ok() ? absl::InternalError("device fault: injected by the test") : fault_;
      }
      if (blocking_) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait_for(lock, std::chrono::milliseconds(5));  // re-poll ShouldStop
      }
    }
    return absl::OkStatus();
  }
  absl::Status DeviceHealth() const override { return device_health_; }
  std::vector<std::string> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  uint64_t steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  // Waits (bounded) until the engine has reported `steps` steps over all runs.
  bool AwaitSteps(uint64_t steps, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return wake_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                          [&] { return steps_ >= steps; });
  }
  bool blocking_ = false;
  uint64_t fault_at_ = 0;
  absl::Status fault_;  // what the step at fault_at_ returns; OK = a device fault of this device
  int eval_replies_per_step_ = 0;  // eval replies reported before each step's OnStep
  absl::Status device_health_;  // what the engine's device reports after a run

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::string> started_;
  std::map<std::string, uint64_t> checkpoint_step_;
  uint64_t steps_ = 0;
};

std::string TempDb(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return path;
}

service::ValidatedJob Job(uint64_t steps) {
  service::ValidatedJob job;
  job.options.steps = steps;
  return job;
}

v1::JobSpec Spec(uint64_t steps) {
  v1::JobSpec spec;
  spec.mutable_hyper()->set_steps(steps);
  return spec;
}

absl::StatusOr<service::ValidatedJob> Revalidate(const v1::JobSpec& spec) {
  return Job(spec.hyper().steps());
}

// Waits (bounded, 20 s) until `reached` holds for the job; *job is the last snapshot. A failed
// WaitForChange is a test failure and ends the wait.
template <typename Reached>
bool AwaitJob(JobRunner& runner, const std::string& id, Reached reached, v1::Job* job) {
  uint64_t version = 0;
  std::string message;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    absl::StatusOr<bool> changed =
        runner.WaitForChange(id, &version, absl::Milliseconds(200), job, &message);
    EXPECT_TRUE(changed.ok()) << changed.status();
    if (!changed.ok()) return false;
    if (reached(*job)) return true;
  }
  return false;
}

// Waits (bounded) until the job reaches `state`; returns the last snapshot.
v1::Job AwaitState(JobRunner& runner, const std::string& id, v1::JobState state) {
  v1::Job job;
  if (!AwaitJob(
          runner, id, [&](const v1::Job& j) { return j.state() == state; }, &job)) {
    ADD_FAILURE() << "job " << id << " never reached " << JobStateName(state) << "; last "
                  << JobStateName(job.state());
  }
  return job;
}

// Waits (bounded) until the job has completed at least `step` steps.
void AwaitStep(JobRunner& runner, const std::string& id, uint64_t step) {
  v1::Job job;
  if (!AwaitJob(
          runner, id, [&](const v1::Job& j) { return j.progress().step() >= step; }, &job)) {
    ADD_FAILURE() << "job " << id << " never reached step " << step;
  }
}

class JobRunnerTest : public ::testing::Test {
 protected:
  std::unique_ptr<JobRunner> MakeRunner(const std::string& db, RunnerLimits limits = {}) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
    EXPECT_TRUE(store.ok());
    absl::StatusOr<std::unique_ptr<JobRunner>> runner = JobRunner::Create(
        std::move(*store), engine_, nullptr, log_, 8, Revalidate, {}, std::move(limits));
    EXPECT_TRUE(runner.ok()) << runner.status();
    return std::move(*runner);
  }
  static service::ValidatedJob JobWithData(const std::string& data, uint64_t steps) {
    service::ValidatedJob job = Job(steps);
    job.options.text_paths = {data};
    return job;
  }
  // A 5-step job training on `data`, run to its first step and stopped by a shutdown (its
  // lineage records the file), then the file changes. Returns the job's id.
  std::string InterruptThenChangeData(const std::string& db, const std::string& data) {
    std::ofstream(data) << "some training text";
    engine_.blocking_ = true;
    std::string id;
    {
      std::unique_ptr<JobRunner> runner = MakeRunner(db);
      runner->Start();
      id = runner->Submit(Spec(5), JobWithData(data, 5))->id();
      AwaitStep(*runner, id, 1);
      EXPECT_TRUE(runner->Shutdown(absl::Seconds(20)));
    }
    std::ofstream(data) << "some training tExt";
    engine_.blocking_ = false;
    return id;
  }
  FakeEngine engine_;
  StructuredLog log_{stderr};
};

TEST_F(JobRunnerTest, RunsJobsInSubmissionOrderWithProgress) {
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("fifo.db"));
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(3), Job(3));
  absl::StatusOr<v1::Job> b = runner->Submit(Spec(5), Job(5));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->state(), v1::QUEUED);
  runner->Start();
  v1::Job done = AwaitState(*runner, b->id(), v1::SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 5u);
  EXPECT_EQ(done.progress().total_steps(), 5u);
  EXPECT_EQ(done.progress().tokens(), 50u);
  EXPECT_DOUBLE_EQ(done.progress().loss(), 1.0);
  EXPECT_EQ(runner->Get(a->id())->state(), v1::SUCCEEDED);
  EXPECT_THAT(engine_.started(), ::testing::ElementsAre(a->id(), b->id()));
  EXPECT_EQ(runner->List({v1::SUCCEEDED}).size(), 2u);
  EXPECT_EQ(runner->List({v1::QUEUED}).size(), 0u);
  // The dashboard's step history: every step of b, its layers, the one validation loss.
  absl::StatusOr<v1::JobHistory> history = runner->History(b->id());
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->steps_size(), 5);
  EXPECT_DOUBLE_EQ(history->steps(4).loss(), 1.0);
  EXPECT_EQ(history->layers_size(), 2);
  EXPECT_EQ(history->validation_size(), 1);
  EXPECT_EQ(runner->History("job-unknown").status().code(), absl::StatusCode::kNotFound);
}

// Eval replies (data.eval_prompts): each an event with its line and EvalReply; the job holds the
// latest kHeldEvalReplyEvents for watchers (a cursor from 0 gets those, oldest first, and then
// only newer ones); the history holds the last round.
TEST_F(JobRunnerTest, EvalReplyEventsAreHeldForWatchersAndTheHistoryKeepsTheLastRound) {
  engine_.eval_replies_per_step_ = 8;
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("eval_replies.db"));
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(3), Job(3));
  ASSERT_TRUE(a.ok());
  runner->Start();
  AwaitState(*runner, a->id(), v1::SUCCEEDED);
  uint64_t cursor = 0;
  const std::vector<v1::ProgressEvent> held = runner->EvalReplyEventsSince(a->id(), &cursor);
  EXPECT_EQ(cursor, 24u);
  ASSERT_EQ(held.size(), kHeldEvalReplyEvents);
  for (size_t i = 0; i < held.size(); ++i) {
    const uint64_t step = 2 + i / 8;  // the last two rounds
    EXPECT_EQ(held[i].job_id(), a->id());
    EXPECT_EQ(held[i].eval_reply().step(), step);
    EXPECT_EQ(held[i].eval_reply().index(), i % 8);
    EXPECT_EQ(held[i].message(), "eval step " + std::to_string(step) + " [" +
                                     std::to_string(i % 8 + 1) + "] \"prompt " +
                                     std::to_string(i % 8) + "\" -> \"reply " +
                                     std::to_string(step) + "\"");
  }
  EXPECT_TRUE(runner->EvalReplyEventsSince(a->id(), &cursor).empty());
  uint64_t late = 20;  // a watcher that saw 20 gets the 4 after them
  EXPECT_EQ(runner->EvalReplyEventsSince(a->id(), &late).size(), 4u);
  absl::StatusOr<v1::JobHistory> history = runner->History(a->id());
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->eval_replies_size(), 8);
  EXPECT_EQ(history->eval_replies(7).step(), 3u);
  EXPECT_EQ(history->eval_replies(7).reply(), "reply 3");
  uint64_t unknown = 0;
  EXPECT_TRUE(runner->EvalReplyEventsSince("job-unknown", &unknown).empty());
}

// Issue 16, point 11: request threads run at SCHED_IDLE; what List, Audit and Checkpoints copy
// or read must happen without the lock the running job's steps take, or a starved request
// thread would stall training. The hook blocks each call until the job has stepped on 3 times.
TEST_F(JobRunnerTest, ReadsNeverHoldTheLockTheRunningJobSteps) {
  engine_.blocking_ = true;
  std::vector<std::string> stepped_on;
  RunnerLimits limits;
  limits.test_read_hook = [&](const char* call) {
    if (engine_.AwaitSteps(engine_.steps() + 3, absl::Seconds(10))) stepped_on.push_back(call);
  };
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("inversion.db"), std::move(limits));
  runner->Start();
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(3), Job(3));
  ASSERT_TRUE(a.ok());
  AwaitStep(*runner, a->id(), 1);
  EXPECT_EQ(runner->List({}).size(), 1u);
  EXPECT_TRUE(runner->Audit(a->id()).ok());
  EXPECT_TRUE(runner->Checkpoints(a->id()).ok());
  EXPECT_THAT(stepped_on, ::testing::ElementsAre("List", "Audit", "Checkpoints"));
  ASSERT_TRUE(runner->Cancel(a->id()).ok());
  AwaitState(*runner, a->id(), v1::CANCELLED);
}

TEST_F(JobRunnerTest, CancelQueuedAndRunning) {
  engine_.blocking_ = true;
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("cancel.db"));
  runner->Start();
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(3), Job(3));
  absl::StatusOr<v1::Job> b = runner->Submit(Spec(3), Job(3));
  AwaitState(*runner, a->id(), v1::RUNNING);
  EXPECT_EQ(runner->Cancel(b->id())->state(), v1::CANCELLED);
  ASSERT_TRUE(runner->Cancel(a->id()).ok());
  AwaitState(*runner, a->id(), v1::CANCELLED);
  EXPECT_EQ(runner->Cancel(a->id()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runner->Cancel("job-999999").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(engine_.started(), ::testing::ElementsAre(a->id()));
}

TEST_F(JobRunnerTest, DeviceFaultFailsJobAndMakesDaemonUnhealthy) {
  engine_.fault_at_ = 2;
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("fault.db"));
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(5), Job(5));
  absl::StatusOr<v1::Job> b = runner->Submit(Spec(5), Job(5));
  runner->Start();
  v1::Job failed = AwaitState(*runner, a->id(), v1::FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("device fault"));
  RunnerStatus status = runner->Status();
  EXPECT_FALSE(status.healthy);
  EXPECT_THAT(status.unhealthy_reason, HasSubstr("injected by the test"));
  absl::StatusOr<v1::Job> refused = runner->Submit(Spec(1), Job(1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("unhealthy"));
  EXPECT_EQ(runner->Get(b->id())->state(), v1::QUEUED);  // not run on a faulty device
  EXPECT_EQ(status.queued, 1);
}

// A job on several machines runs in rank processes with devices of their own: a device fault a
// rank reports (on this machine or another) pauses the job and leaves the daemon healthy.
TEST_F(JobRunnerTest, ARanksDeviceFaultPausesItsJobAndLeavesTheDaemonHealthy) {
  engine_.fault_at_ = 2;
  engine_.fault_ = ResumableFailure(absl::InternalError("rank 1 on node2: device fault: x"));
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("rank_fault.db"));
  service::ValidatedJob on_hosts = Job(5);
  on_hosts.hosts = {{"localhost", 1}, {"node2", 1}};
  on_hosts.ranks = 2;
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(5), on_hosts);
  ASSERT_TRUE(a.ok()) << a.status();
  runner->Start();
  v1::Job paused = AwaitState(*runner, a->id(), v1::PAUSED);
  EXPECT_THAT(paused.failure_reason(), HasSubstr("rank 1 on node2: device fault"));
  RunnerStatus status = runner->Status();
  EXPECT_TRUE(status.healthy) << status.unhealthy_reason;
  EXPECT_TRUE(runner->Submit(Spec(1), Job(1)).ok());
}

TEST_F(JobRunnerTest, UnhealthyDeviceAfterASucceededJobStopsTheQueue) {
  engine_.device_health_ = absl::InternalError("device fault: went bad after the last step");
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("health.db"));
  absl::StatusOr<v1::Job> a = runner->Submit(Spec(2), Job(2));
  absl::StatusOr<v1::Job> b = runner->Submit(Spec(2), Job(2));
  runner->Start();
  AwaitState(*runner, a->id(), v1::SUCCEEDED);
  const RunnerStatus status = runner->Status();
  EXPECT_FALSE(status.healthy);
  EXPECT_THAT(status.unhealthy_reason, HasSubstr("went bad after the last step"));
  EXPECT_EQ(runner->Get(b->id())->state(), v1::QUEUED);
  EXPECT_THAT(engine_.started(), ::testing::ElementsAre(a->id()));
}

TEST_F(JobRunnerTest, ShutdownRequeuesRunningJobAndRestartKeepsOrder) {
  const std::string db = TempDb("restart.db");
  std::string a_id, b_id;
  engine_.blocking_ = true;
  {
    std::unique_ptr<JobRunner> runner = MakeRunner(db);
    runner->Start();
    a_id = runner->Submit(Spec(4), Job(4))->id();
    b_id = runner->Submit(Spec(2), Job(2))->id();
    AwaitStep(*runner, a_id, 1);  // a stop before the first step would leave no checkpoint
    EXPECT_TRUE(runner->Shutdown(absl::Seconds(20)));
    EXPECT_EQ(runner->Get(a_id)->state(), v1::QUEUED);
    EXPECT_THAT(runner->Get(a_id)->progress().last_checkpoint(), HasSubstr("/ckpt/" + a_id));
    EXPECT_EQ(runner->Submit(Spec(1), Job(1)).status().code(), absl::StatusCode::kUnavailable);
  }
  engine_.blocking_ = false;
  std::unique_ptr<JobRunner> runner = MakeRunner(db);
  EXPECT_EQ(runner->Status().queued, 2);
  runner->Start();
  AwaitState(*runner, b_id, v1::SUCCEEDED);
  EXPECT_EQ(runner->Get(a_id)->state(), v1::SUCCEEDED);
  EXPECT_EQ(runner->Get(a_id)->progress().step(), 4u);
  EXPECT_EQ(runner->Get(a_id)->progress().tokens(), 40u);  // from the job's start
  EXPECT_THAT(engine_.started(), ::testing::ElementsAre(a_id, a_id, b_id));
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records = runner->Checkpoints(a_id);
  ASSERT_TRUE(records.ok());
  ASSERT_FALSE(records->empty());  // the shutdown checkpoint, recorded in the store
  EXPECT_EQ(records->front().job_id(), a_id);
  EXPECT_GT(records->front().step(), 0u);
  // New ids continue after the stored ones.
  EXPECT_GT(runner->Submit(Spec(1), Job(1))->id(), b_id);
}

TEST_F(JobRunnerTest, JobRunningAtACrashIsQueuedFirstAndUnknownSpecsFail) {
  const std::string db = TempDb("crash.db");
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
    ASSERT_TRUE(store.ok());
    v1::Job running, queued, bad;
    running.set_id("job-000001");
    running.set_state(v1::RUNNING);  // what a SIGKILL leaves behind
    *running.mutable_spec() = Spec(2);
    running.mutable_progress()->set_step(1);
    queued.set_id("job-000002");
    queued.set_state(v1::QUEUED);
    *queued.mutable_spec() = Spec(2);
    bad.set_id("job-000003");
    bad.set_state(v1::QUEUED);
    *bad.mutable_spec() = Spec(0);  // re-validation refuses it
    ASSERT_TRUE((*store)->PutJob(2, queued).ok());
    ASSERT_TRUE((*store)->PutJob(1, running).ok());
    ASSERT_TRUE((*store)->PutJob(3, bad).ok());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
  ASSERT_TRUE(store.ok());
  absl::StatusOr<std::unique_ptr<JobRunner>> runner =
      JobRunner::Create(std::move(*store), engine_, nullptr, log_, 8, [](const v1::JobSpec& spec) {
        if (spec.hyper().steps() == 0) {
          return absl::StatusOr<service::ValidatedJob>(
              absl::InvalidArgumentError("hyper.steps: 0"));
        }
        return absl::StatusOr<service::ValidatedJob>(Job(spec.hyper().steps()));
      });
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->Get("job-000001")->state(), v1::QUEUED);
  EXPECT_EQ((*runner)->Get("job-000001")->progress().step(), 0u);
  EXPECT_EQ((*runner)->Get("job-000003")->state(), v1::FAILED);
  EXPECT_THAT((*runner)->Get("job-000003")->failure_reason(), HasSubstr("hyper.steps"));
  (*runner)->Start();
  AwaitState(**runner, "job-000002", v1::SUCCEEDED);
  EXPECT_THAT(engine_.started(), ::testing::ElementsAre("job-000001", "job-000002"));
}

TEST_F(JobRunnerTest, PauseRunningAndQueuedJobsThenResume) {
  engine_.blocking_ = true;
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("pause.db"));
  runner->Start();
  const std::string a = runner->Submit(Spec(7), Job(7))->id();
  const std::string b = runner->Submit(Spec(3), Job(3))->id();
  AwaitState(*runner, a, v1::RUNNING);
  AwaitStep(*runner, a, 1);  // a step done, so the pause has a step to checkpoint
  EXPECT_EQ(runner->Pause(b)->state(), v1::PAUSED);
  EXPECT_EQ(runner->Resume(a).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(runner->Pause(a).ok());
  v1::Job paused = AwaitState(*runner, a, v1::PAUSED);
  EXPECT_THAT(paused.progress().last_checkpoint(), HasSubstr("/ckpt/" + a));
  EXPECT_EQ(runner->Pause(a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runner->Status().queued, 0);  // b is paused, not queued
  engine_.blocking_ = false;
  EXPECT_EQ(runner->Resume(a)->state(), v1::QUEUED);
  EXPECT_EQ(runner->Resume(b)->state(), v1::QUEUED);
  AwaitState(*runner, a, v1::SUCCEEDED);
  AwaitState(*runner, b, v1::SUCCEEDED);
  EXPECT_EQ(runner->Get(a)->progress().step(), 7u);
  // Counted from the start of the job, not from the resume (10 tokens per step).
  EXPECT_EQ(runner->Get(a)->progress().tokens(), 70u);
  EXPECT_THAT(engine_.started(), ::testing::ElementsAre(a, a, b));
}

TEST_F(JobRunnerTest, CheckpointNowAnswersWithTheCommittedRecord) {
  engine_.blocking_ = true;
  std::unique_ptr<JobRunner> runner = MakeRunner(TempDb("checkpoint.db"));
  const std::string queued_id = runner->Submit(Spec(3), Job(3))->id();
  EXPECT_EQ(runner->CheckpointNow(queued_id, absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runner->CheckpointNow("job-999999", absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  runner->Start();
  AwaitState(*runner, queued_id, v1::RUNNING);
  absl::StatusOr<v1::CheckpointRecord> record = runner->CheckpointNow(queued_id, absl::Seconds(20));
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->job_id(), queued_id);
  EXPECT_GT(record->step(), 0u);
  EXPECT_EQ(runner->Get(queued_id)->progress().last_checkpoint(), record->path());
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records = runner->Checkpoints(queued_id);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ(records->front().path(), record->path());
  ASSERT_TRUE(runner->Cancel(queued_id).ok());
  AwaitState(*runner, queued_id, v1::CANCELLED);
  EXPECT_EQ(runner->Checkpoints(queued_id)->size(), 1u);  // a cancel writes none
}

// A cancel asked while the job's inputs are checked wins over what the check then finds: a job
// whose data changed since its lineage was recorded ends CANCELLED, not PAUSED for the change.
TEST_F(JobRunnerTest, ACancelDuringTheInputCheckIsNotLost) {
  const std::string db = TempDb("cancel_input_check.db");
  const std::string data = TempDb("cancel_input_check.txt");
  auto job_with_data = [&](uint64_t steps) { return JobWithData(data, steps); };
  const std::string id = InterruptThenChangeData(db, data);
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
  ASSERT_TRUE(store.ok());
  JobRunner* runner = nullptr;
  absl::Status cancelled = absl::UnknownError("the input check never ran");
  RunnerLimits limits;
  limits.test_after_input_check = [&](const std::string& job_id) {
    cancelled = runner->Cancel(job_id).status();
  };
  absl::StatusOr<std::unique_ptr<JobRunner>> created = JobRunner::Create(
      std::move(*store), engine_, nullptr, log_, 8,
      [&](const v1::JobSpec& spec) -> absl::StatusOr<service::ValidatedJob> {
        return job_with_data(spec.hyper().steps());
      },
      {}, std::move(limits));
  ASSERT_TRUE(created.ok()) << created.status();
  runner = created->get();
  runner->Start();
  const v1::Job done = AwaitState(*runner, id, v1::CANCELLED);
  EXPECT_TRUE(cancelled.ok()) << cancelled;
  EXPECT_EQ(done.state(), v1::CANCELLED);
  absl::StatusOr<v1::AuditLog> audit = runner->Audit(id);
  ASSERT_TRUE(audit.ok()) << audit.status();
  ASSERT_GT(audit->entries_size(), 0);
  EXPECT_EQ(audit->entries(audit->entries_size() - 1).kind(), "cancel");
  EXPECT_THAT(audit->entries(audit->entries_size() - 1).message(),
              HasSubstr("cancelled before its first step"));
  EXPECT_TRUE(runner->Shutdown(absl::Seconds(20)));
}

// A job interrupted by a restart whose data file changed meanwhile: the runner's data check keeps
// it PAUSED naming the file; a plain resume is refused; the allowance resumes it and records
// the change in its lineage and audit log.
TEST_F(JobRunnerTest, ChangedDataAfterRestartPausesUntilAllowed) {
  const std::string db = TempDb("data_change.db");
  const std::string data = TempDb("data_change.txt");
  std::ofstream(data) << "some training text";
  auto job_with_data = [&](uint64_t steps) {
    service::ValidatedJob job = Job(steps);
    job.options.text_paths = {data};
    return job;
  };
  std::string id;
  engine_.blocking_ = true;
  {
    std::unique_ptr<JobRunner> runner = MakeRunner(db);
    runner->Start();
    id = runner->Submit(Spec(5), job_with_data(5))->id();
    AwaitStep(*runner, id, 1);
    absl::StatusOr<provenance::Lineage> lineage = runner->JobLineage(id);
    ASSERT_TRUE(lineage.ok()) << lineage.status();
    ASSERT_EQ(lineage->inputs.size(), 1u);
    EXPECT_EQ(lineage->inputs[0].path, data);
    EXPECT_TRUE(runner->Shutdown(absl::Seconds(20)));
  }
  std::ofstream(data) << "some training tExt";
  engine_.blocking_ = false;
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
  ASSERT_TRUE(store.ok());
  absl::StatusOr<std::unique_ptr<JobRunner>> created =
      JobRunner::Create(std::move(*store), engine_, nullptr, log_, 8,
                        [&](const v1::JobSpec& spec) -> absl::StatusOr<service::ValidatedJob> {
                          return job_with_data(spec.hyper().steps());
                        });
  ASSERT_TRUE(created.ok()) << created.status();
  JobRunner& runner = **created;
  runner.Start();
  const v1::Job paused = AwaitState(runner, id, v1::PAUSED);
  EXPECT_THAT(paused.failure_reason(), HasSubstr(data + " changed"));
  EXPECT_THAT(paused.failure_reason(), HasSubstr("--allow-data-change"));
  absl::StatusOr<v1::Job> refused = runner.Resume(id);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(data));
  ASSERT_TRUE(runner.Resume(id, /*allow_data_change=*/true).ok());
  const v1::Job done = AwaitState(runner, id, v1::SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 5u);
  EXPECT_TRUE(done.failure_reason().empty());
  absl::StatusOr<provenance::Lineage> lineage = runner.JobLineage(id);
  ASSERT_TRUE(lineage.ok());
  ASSERT_EQ(lineage->data_changes.size(), 1u);
  EXPECT_EQ(lineage->data_changes[0].path, data);
  EXPECT_NE(lineage->data_changes[0].old_sha256_hex, lineage->data_changes[0].new_sha256_hex);
  EXPECT_FALSE(lineage->data_changes[0].allowed_at.empty());

  absl::StatusOr<v1::AuditLog> audit = runner.Audit(id);
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE(audit->chain_ok()) << audit->problem();
  std::vector<std::string> kinds;
  for (const v1::AuditEntry& e : audit->entries()) kinds.push_back(e.kind());
  EXPECT_THAT(kinds, ::testing::IsSupersetOf({"submit", "start", "lineage_recorded", "checkpoint",
                                              "interrupted_by_shutdown", "data_change_refused",
                                              "resume", "data_change_allowed", "completion"}));
  EXPECT_EQ(kinds.front(), "submit");
  EXPECT_EQ(kinds.back(), "completion");
}

}  // namespace
}  // namespace megatrain::server
