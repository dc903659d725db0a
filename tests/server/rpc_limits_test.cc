// Issue 16, point 8, against an in-process megatraind on its Unix socket: ListJobs pages (and
// a response over the send limit is refused while its pages pass), handler threads are capped
// (calls beyond are RESOURCE_EXHAUSTED, the daemon answers again once they end), an idle
// connection is closed by the daemon, and PurgeJobs removes ended jobs for good (their ids are
// never given again after a restart). Waits are on events and states, bounded.
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_daemon.h"

namespace megatrain::server {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::TestDaemon;

std::string Submit(TestDaemon& d, uint64_t steps) {
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = d.ValidSpec(steps);
  v1::Job job;
  const grpc::Status s = d.stub().SubmitJob(&context, request, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job.id();
}

grpc::Status List(TestDaemon& d, uint32_t page_size, const std::string& token,
                  v1::ListJobsResponse* response) {
  grpc::ClientContext context;
  v1::ListJobsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(token);
  return d.stub().ListJobs(&context, request, response);
}

std::vector<std::string> AllIdsByPages(TestDaemon& d, uint32_t page_size, int* pages) {
  std::vector<std::string> ids;
  std::string token;
  *pages = 0;
  do {
    v1::ListJobsResponse page;
    const grpc::Status s = List(d, page_size, token, &page);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) break;
    EXPECT_LE(page.jobs_size(), static_cast<int>(page_size));
    for (const v1::Job& job : page.jobs()) ids.push_back(job.id());
    token = page.next_page_token();
    ++*pages;
  } while (!token.empty() && *pages < 100);
  return ids;
}

TEST(RpcLimitsTest, ListJobsPagesAndOversizeResponsesAreRefused) {
  TestDaemon d("rpc_pages");
  d.Start();
  std::vector<std::string> submitted;
  for (int i = 0; i < 12; ++i) submitted.push_back(Submit(d, 1));
  const v1::Job last = d.AwaitState(submitted.back(), v1::SUCCEEDED);
  // A send limit that holds a page of 3 jobs but not all 12.
  d.settings().max_send_message_bytes = static_cast<int>(4 * last.ByteSizeLong() + 256);
  d.Restart();
  v1::ListJobsResponse all;
  EXPECT_EQ(List(d, 0, "", &all).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  int pages = 0;
  EXPECT_THAT(AllIdsByPages(d, 3, &pages), ElementsAreArray(submitted));
  EXPECT_EQ(pages, 4);
  v1::ListJobsResponse refused;
  grpc::Status s = List(d, 5, "junk", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("page_token"));
  s = List(d, kMaxListPageSize + 1, "", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("page_size"));
}

TEST(RpcLimitsTest, HandlerThreadsAreCapped) {
  TestDaemon d("rpc_threads");
  d.settings().max_rpc_threads = 4;
  d.Start();
  const std::string id = Submit(d, 1'000'000);
  d.AwaitState(id, v1::RUNNING, 1);
  // Each accepted watch holds a handler thread until it is cancelled.
  constexpr int kWatchers = 12;
  std::mutex mu;
  std::condition_variable settled_cv;
  int holding = 0;
  std::vector<grpc::StatusCode> failures;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int i = 0; i < kWatchers; ++i) contexts.push_back(std::make_unique<grpc::ClientContext>());
  std::vector<std::thread> watchers;
  for (int i = 0; i < kWatchers; ++i) {
    watchers.emplace_back([&, i] {
      auto channel = grpc::CreateChannel("unix:" + d.settings().socket_path,
                                         grpc::InsecureChannelCredentials());
      auto stub = v1::Trainer::NewStub(channel);
      v1::WatchJobRequest request;
      request.set_id(id);
      auto reader = stub->WatchJob(contexts[i].get(), request);
      v1::ProgressEvent event;
      const bool got = reader->Read(&event);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (got) ++holding;
      }
      settled_cv.notify_all();
      if (got) {
        while (reader->Read(&event)) {
        }
      }
      const grpc::Status status = reader->Finish();
      if (!got) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(status.error_code());
        settled_cv.notify_all();
      }
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(settled_cv.wait_for(
        lock, std::chrono::seconds(60),
        [&] { return holding + static_cast<int>(failures.size()) == kWatchers; }))
        << holding << " holding, " << failures.size() << " refused";
    EXPECT_LE(holding, 4);
    EXPECT_FALSE(failures.empty());
    for (grpc::StatusCode code : failures) EXPECT_EQ(code, grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  for (auto& c : contexts) c->TryCancel();
  for (std::thread& t : watchers) t.join();
  // The threads come back: a call succeeds again (bounded retries while they wind down).
  bool answered = false;
  for (int attempt = 0; attempt < 300 && !answered; ++attempt) {
    grpc::ClientContext context;
    v1::DaemonStatus status;
    answered = d.stub().GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status).ok();
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(answered);
  grpc::ClientContext context;
  v1::JobRef ref;
  ref.set_id(id);
  v1::Job job;
  EXPECT_TRUE(d.stub().CancelJob(&context, ref, &job).ok());
}

TEST(RpcLimitsTest, AnIdleConnectionIsClosedByTheDaemon) {
  TestDaemon d("rpc_idle");
  d.settings().max_connection_idle_ms = 500;
  d.Start();
  grpc::ClientContext context;
  v1::DaemonStatus status;
  ASSERT_TRUE(d.stub().GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status).ok());
  ASSERT_EQ(d.channel()->GetState(false), GRPC_CHANNEL_READY);
  // The event: the channel leaves READY when the daemon closes the idle connection.
  EXPECT_TRUE(d.channel()->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(30)))
      << "the daemon kept an idle connection open for 30 s";
}

TEST(RpcLimitsTest, PurgeRemovesEndedJobsForGood) {
  TestDaemon d("rpc_purge");
  d.Start();
  const std::string done1 = Submit(d, 1);
  const std::string done2 = Submit(d, 1);
  d.AwaitState(done2, v1::SUCCEEDED);
  const std::string running = Submit(d, 1'000'000);
  d.AwaitState(running, v1::RUNNING, 1);
  {
    grpc::ClientContext context;
    v1::PurgeJobsRequest request;
    v1::PurgeJobsResponse response;
    const grpc::Status s = d.stub().PurgeJobs(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("finished_before_unix_ms"));
  }
  grpc::ClientContext context;
  v1::PurgeJobsRequest request;
  request.set_finished_before_unix_ms(absl::ToUnixMillis(absl::Now()) + 1000);
  v1::PurgeJobsResponse response;
  ASSERT_TRUE(d.stub().PurgeJobs(&context, request, &response).ok());
  EXPECT_THAT(response.purged_ids(), ElementsAreArray({done1, done2}));
  int pages = 0;
  EXPECT_THAT(AllIdsByPages(d, 10, &pages), ElementsAreArray({running}));
  {
    grpc::ClientContext get_context;
    v1::GetJobRequest get;
    get.set_id(done1);
    v1::Job job;
    EXPECT_EQ(d.stub().GetJob(&get_context, get, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  d.Restart();  // the running job is re-queued; the purged ones stay gone
  EXPECT_THAT(AllIdsByPages(d, 10, &pages), ElementsAreArray({running}));
  grpc::ClientContext cancel_context;
  v1::JobRef ref;
  ref.set_id(running);
  v1::Job cancelled;
  ASSERT_TRUE(d.stub().CancelJob(&cancel_context, ref, &cancelled).ok());
  d.AwaitState(running, v1::CANCELLED);
  // A new job never gets a purged job's id, also after the last jobs were purged.
  grpc::ClientContext purge_again;
  request.set_finished_before_unix_ms(absl::ToUnixMillis(absl::Now()) + 1000);
  ASSERT_TRUE(d.stub().PurgeJobs(&purge_again, request, &response).ok());
  d.Restart();
  const std::string fresh = Submit(d, 1);
  EXPECT_NE(fresh, done1);
  EXPECT_NE(fresh, done2);
  EXPECT_NE(fresh, running);
  EXPECT_GT(fresh, running);
}

}  // namespace
}  // namespace megatrain::server
