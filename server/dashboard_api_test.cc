// DashboardApi with a real runner and a fake engine: the page and its files, the JSON of the
// daemon, the job list (without paths) and one job with its history and checkpoints; unknown
// ids, odd ids and non-loopback Host headers (configured names pass); checkpoints' manifests
// checked again; /api/events sends the jobs and the selected job after each step.
#include "server/dashboard_api.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs `steps` steps with two layers each and a checkpoint at the end.
class StepsEngine final : public JobEngine {
 public:
  absl::Status Run(const std::string& job_id, const service::ValidatedJob& job,
                   engine::TrainingObserver& observer) override {
    for (uint64_t step = 1; step <= job.options.steps; ++step) {
      engine::StepReport report;
      report.step = step;
      report.loss = 4.0 / static_cast<double>(step);
      report.tokens = 8;
      report.layers.resize(2);
      report.layers[0].copy_in_seconds = 0.5;
      observer.OnStep(report, 3.0);
    }
    std::string path = "/nonexistent/ckpt/" + job_id;
    if (!checkpoint_root.empty()) {  // a checkpoint with a manifest, hashed at commit
      path = checkpoint_root + "/" + job_id;
      std::filesystem::create_directories(path);
      std::ofstream(path + "/manifest.json") << "{\"step\": " << job.options.steps << "}";
    }
    observer.OnCheckpoint(job.options.steps, path);
    return absl::OkStatus();
  }
  std::string checkpoint_root;  // empty: a path that does not exist
};

class DashboardApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("TEST_TMPDIR");
    const std::string db = std::string(dir ? dir : "/tmp") + "/dashboard_api.db";
    std::remove(db.c_str());
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    auto revalidate = [](const v1::JobSpec& spec) -> absl::StatusOr<service::ValidatedJob> {
      service::ValidatedJob job;
      job.options.steps = spec.hyper().steps();
      return job;
    };
    absl::StatusOr<std::unique_ptr<JobRunner>> runner =
        JobRunner::Create(std::move(*store), engine_, nullptr, log_, 8, revalidate);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
    settings_.device.arena_bytes = 1 << 20;
    settings_.max_ram_bytes = 1 << 30;
    api_ = std::make_unique<DashboardApi>(settings_, *runner_, "ab12");
  }

  // Submits and runs a job of `steps` steps to its end (bounded wait).
  std::string RunJob(uint64_t steps) {
    v1::JobSpec spec;
    spec.set_name("tiny");
    spec.set_output_dir("/secret/out");
    spec.mutable_data()->add_text_files("/secret/corpus.txt");
    spec.mutable_hyper()->set_steps(steps);
    service::ValidatedJob job;
    job.options.steps = steps;
    absl::StatusOr<v1::Job> submitted = runner_->Submit(spec, std::move(job));
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    runner_->Start();
    uint64_t version = 0;
    v1::Job seen;
    std::string message;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (seen.state() != v1::SUCCEEDED && absl::Now() < deadline) {
      (void)runner_->WaitForChange(submitted->id(), &version, absl::Milliseconds(200), &seen,
                                   &message);
    }
    EXPECT_EQ(seen.state(), v1::SUCCEEDED);
    return submitted->id();
  }

  std::string Get(const std::string& target, const std::string& status = "200 OK") {
    std::optional<HttpReply> reply = api_->Handle(target, "127.0.0.1:9000");
    EXPECT_TRUE(reply.has_value()) << target;
    if (!reply.has_value()) return "";
    EXPECT_EQ(reply->status, status) << target << ": " << reply->body;
    return reply->body;
  }

  StepsEngine engine_;
  StructuredLog log_{stderr};
  service::DaemonSettings settings_;
  std::unique_ptr<JobRunner> runner_;
  std::unique_ptr<DashboardApi> api_;
};

TEST_F(DashboardApiTest, ServesThePageAndItsFiles) {
  std::optional<HttpReply> page = api_->Handle("/", "localhost:1");
  ASSERT_TRUE(page.has_value());
  EXPECT_THAT(page->content_type, HasSubstr("text/html"));
  EXPECT_THAT(page->body, HasSubstr("dashboard.js"));
  EXPECT_THAT(api_->Handle("/dashboard.js", "")->content_type, HasSubstr("javascript"));
  EXPECT_THAT(api_->Handle("/dashboard.css?v=1", "")->content_type, HasSubstr("text/css"));
  EXPECT_FALSE(api_->Handle("/nothing.txt", "").has_value());
  EXPECT_FALSE(api_->Handle("/../server/BUILD", "").has_value());
}

TEST_F(DashboardApiTest, DaemonStatusWithTiersAndBudgets) {
  const std::string body = Get("/api/daemon");
  EXPECT_THAT(body, HasSubstr("\"healthy\":true"));
  EXPECT_THAT(body, HasSubstr("\"public_key\":\"ab12\""));
  EXPECT_THAT(body,
              HasSubstr("{\"tier\":\"device\",\"bytes\":\"0\",\"budget_bytes\":\"1048576\"}"));
  EXPECT_THAT(body,
              HasSubstr("{\"tier\":\"ram\",\"bytes\":\"0\",\"budget_bytes\":\"1073741824\"}"));
  settings_.max_ram_bytes = 0;  // the physical RAM instead
  EXPECT_THAT(Get("/api/daemon"),
              HasSubstr("\"tier\":\"ram\",\"bytes\":\"0\",\"budget_bytes\":\""));
  EXPECT_THAT(Get("/api/daemon"), Not(HasSubstr("\"budget_bytes\":\"0\"}]")));
}

TEST_F(DashboardApiTest, JobsAndOneJobWithHistoryWithoutPaths) {
  const std::string id = RunJob(6);
  const std::string list = Get("/api/jobs");
  EXPECT_THAT(list, HasSubstr(absl::StrCat("\"id\":\"", id, "\"")));
  EXPECT_THAT(list, HasSubstr("\"state\":\"SUCCEEDED\""));
  EXPECT_THAT(list, Not(HasSubstr("/secret")));
  const std::string job = Get(absl::StrCat("/api/jobs/", id));
  EXPECT_THAT(job, HasSubstr("\"name\":\"tiny\""));
  EXPECT_THAT(job, Not(HasSubstr("/secret")));
  EXPECT_THAT(job, HasSubstr("\"history\":{\"job_id\":\"" + id));
  EXPECT_THAT(job, HasSubstr("{\"step\":\"6\""));
  EXPECT_THAT(job, HasSubstr("\"copy_in_seconds\":0.5"));
  EXPECT_THAT(job, HasSubstr("\"validation\":[{\"step\":\"1\",\"validation_loss\":3}]"));
  EXPECT_THAT(job, HasSubstr("\"path\":\"/nonexistent/ckpt/" + id));
  EXPECT_THAT(job, HasSubstr("\"checkpoint_checks\":[\"not_hashed\"]"));
}

TEST_F(DashboardApiTest, CheckpointsManifestCheckedAgainstTheRecordedHash) {
  const char* dir = std::getenv("TEST_TMPDIR");
  engine_.checkpoint_root = std::string(dir ? dir : "/tmp") + "/dashboard_ckpt";
  const std::string id = RunJob(2);
  const std::string manifest = engine_.checkpoint_root + "/" + id + "/manifest.json";
  EXPECT_THAT(Get("/api/jobs/" + id), HasSubstr("\"checkpoint_checks\":[\"manifest_matches\"]"));
  std::ofstream(manifest) << "{\"step\": 3}";
  EXPECT_THAT(Get("/api/jobs/" + id), HasSubstr("\"checkpoint_checks\":[\"manifest_changed\"]"));
  std::filesystem::remove(manifest);
  EXPECT_THAT(Get("/api/jobs/" + id), HasSubstr("\"checkpoint_checks\":[\"missing\"]"));
}

TEST_F(DashboardApiTest, UnknownAndOddIdsAndForeignHosts) {
  EXPECT_THAT(Get("/api/jobs/job-999999", "404 Not Found"), HasSubstr("not found"));
  EXPECT_THAT(Get("/api/jobs/a%22b", "400 Bad Request"), HasSubstr("\"error\""));
  std::optional<HttpReply> foreign = api_->Handle("/api/jobs", "evil.example:8080");
  ASSERT_TRUE(foreign.has_value());
  EXPECT_EQ(foreign->status, "403 Forbidden");
  EXPECT_TRUE(IsLoopbackHost("[::1]:9"));
  EXPECT_FALSE(IsLoopbackHost("localhost.evil.example"));
  EXPECT_FALSE(IsLoopbackHost("127.0.0.10:80"));
  // Exposed with a configured name: that name passes, others still do not.
  DashboardApi named(settings_, *runner_, "ab12", {"trainer.example"});
  EXPECT_EQ(named.Handle("/api/jobs", "trainer.example:9443")->status, "200 OK");
  EXPECT_EQ(named.Handle("/api/jobs", "evil.example:9443")->status, "403 Forbidden");
}

// An EventSink that records what a stream sends until the test closes it.
class RecordingSink final : public EventSink {
 public:
  bool Send(absl::string_view text) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.emplace_back(text);
    cv_.notify_all();
    return !closed_;
  }
  bool Open() override {
    std::lock_guard<std::mutex> lock(mu_);
    return !closed_;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  // True when an event containing every one of `needles` was sent within `timeout`.
  bool Await(const std::vector<std::string>& needles, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
      for (const std::string& text : sent_) {
        bool all = true;
        for (const std::string& n : needles) all = all && absl::StrContains(text, n);
        if (all) return true;
      }
      return false;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> sent_;
  bool closed_ = false;
};

TEST_F(DashboardApiTest, EventsFollowTheRunnersChanges) {
  EXPECT_THAT(Get("/api/events?job=a%22b", "400 Bad Request"), HasSubstr("\"error\""));
  std::optional<HttpReply> reply = api_->Handle("/api/events?job=job-000001", "127.0.0.1:1");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->content_type, "text/event-stream; charset=utf-8");
  ASSERT_TRUE(reply->stream);
  RecordingSink sink;
  std::thread stream([&] { reply->stream(sink); });
  // At once: the (empty) job list; the selected job does not exist yet.
  EXPECT_TRUE(sink.Await({"event: jobs\ndata: {\"daemon\":", "\"list\":{"}, absl::Seconds(20)));
  EXPECT_TRUE(sink.Await({"event: job_error\n"}, absl::Seconds(20)));
  // The job's steps and its end reach the stream as they happen (the runner's notifications).
  const std::string id = RunJob(5);
  EXPECT_EQ(id, "job-000001");
  EXPECT_TRUE(sink.Await({"event: jobs\n", "\"id\":\"job-000001\""}, absl::Seconds(20)));
  EXPECT_TRUE(sink.Await({"event: job\ndata: {\"job\":{\"id\":\"job-000001\"",
                          "\"state\":\"SUCCEEDED\"", "\"step\":\"5\""},
                         absl::Seconds(20)));
  sink.Close();
  stream.join();  // the stream notices within its bounded wait
}

}  // namespace
}  // namespace megatrain::server
