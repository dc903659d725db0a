// Issue 16, point 8, against an in-process megatraind on its Unix socket: ListJobs pages (and
// a response over the send limit is refused while its pages pass), a request over the receive
// limit is refused, handler threads are capped (calls beyond are RESOURCE_EXHAUSTED, the daemon
// answers again once they end), streams beyond max_concurrent_streams wait on their connection
// while another connection is served, an idle connection, a client pinging too often and a
// connection that leaves the daemon's keepalive pings unanswered are closed by the daemon, and
// PurgeJobs removes ended jobs for good (their ids are never given again after a restart). Waits
// are on events and states, bounded.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
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
  // One answered call does not mean every thread is back: a later call may still find the quota
  // spent (RESOURCE_EXHAUSTED, refused before any handler runs), so retry that, bounded.
  v1::JobRef ref;
  ref.set_id(id);
  grpc::Status cancelled;
  for (int attempt = 0; attempt < 300; ++attempt) {
    grpc::ClientContext context;
    v1::Job job;
    cancelled = d.stub().CancelJob(&context, ref, &job);
    if (cancelled.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(cancelled.ok()) << cancelled.error_code() << ": " << cancelled.error_message();
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

TEST(RpcLimitsTest, ARequestOverTheReceiveLimitIsRefused) {
  TestDaemon d("rpc_receive");
  d.settings().max_receive_message_bytes = 64 << 10;
  d.Start();
  v1::SubmitJobRequest request;
  *request.mutable_spec() = d.ValidSpec(1);
  request.mutable_spec()->set_name(std::string(100 << 10, 'x'));
  ASSERT_GT(request.ByteSizeLong(), 64u << 10);
  grpc::ClientContext context;
  v1::Job job;
  const grpc::Status s = d.stub().SubmitJob(&context, request, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // Refused before it was read: nothing was submitted, and the same connection still works.
  int pages = 0;
  EXPECT_TRUE(AllIdsByPages(d, 10, &pages).empty());
  EXPECT_FALSE(Submit(d, 1).empty());
}

// A channel on a connection of its own: gRPC shares one connection between channels to the same
// target unless each keeps a local subchannel pool.
std::shared_ptr<grpc::Channel> OwnConnection(TestDaemon& d, grpc::ChannelArguments args = {}) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel("unix:" + d.settings().socket_path,
                                   grpc::InsecureChannelCredentials(), args);
}

TEST(RpcLimitsTest, StreamsBeyondTheLimitWaitOnTheirConnection) {
  TestDaemon d("rpc_streams");
  d.settings().max_concurrent_streams = 2;
  d.Start();
  const std::string id = Submit(d, 1'000'000);
  d.AwaitState(id, v1::RUNNING, 1);
  std::unique_ptr<v1::Trainer::Stub> stub = v1::Trainer::NewStub(OwnConnection(d));
  v1::WatchJobRequest request;
  request.set_id(id);
  auto deadline = [](int seconds) {
    return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
  };
  // Two watches take both streams of the connection (each has its first event).
  grpc::ClientContext held[2];
  std::unique_ptr<grpc::ClientReader<v1::ProgressEvent>> readers[2];
  v1::ProgressEvent event;
  for (int i = 0; i < 2; ++i) {
    held[i].set_deadline(deadline(60));
    readers[i] = stub->WatchJob(&held[i], request);
    ASSERT_TRUE(readers[i]->Read(&event)) << "watch " << i << " was not served";
  }
  // A third on the same connection is not served while they are held: it waits for a stream
  // (gRPC queues it on the client) until its deadline. Only a stream's release can let it in,
  // so the outcome does not depend on the machine's speed; the deadline only bounds the wait.
  {
    grpc::ClientContext third;
    third.set_deadline(deadline(2));
    auto reader = stub->WatchJob(&third, request);
    EXPECT_FALSE(reader->Read(&event)) << "a third stream was served beyond the limit of 2";
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The daemon answers another connection meanwhile.
  {
    grpc::ClientContext context;
    context.set_deadline(deadline(30));
    v1::DaemonStatus status;
    EXPECT_TRUE(d.stub().GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status).ok());
  }
  // Once a stream is released, the next watch on the connection is served.
  held[0].TryCancel();
  readers[0]->Finish();
  {
    grpc::ClientContext next;
    next.set_deadline(deadline(30));
    auto reader = stub->WatchJob(&next, request);
    EXPECT_TRUE(reader->Read(&event)) << "a released stream was not given to the next call";
    next.TryCancel();
    reader->Finish();
  }
  held[1].TryCancel();
  readers[1]->Finish();
  grpc::ClientContext cancel_context;
  v1::JobRef ref;
  ref.set_id(id);
  v1::Job job;
  EXPECT_TRUE(d.stub().CancelJob(&cancel_context, ref, &job).ok());
}

TEST(RpcLimitsTest, AClientThatPingsTooOftenIsSentAway) {
  TestDaemon d("rpc_pings");
  d.Start();
  // Pings every 100 ms without calls; the daemon allows one per 10 s and sends a GOAWAY
  // ("too many pings") after two strikes. The idle close is 5 min, so it is not what ends it.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::shared_ptr<grpc::Channel> channel = OwnConnection(d, args);
  grpc::ClientContext context;
  v1::DaemonStatus status;
  ASSERT_TRUE(v1::Trainer::NewStub(channel)
                  ->GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status)
                  .ok());
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(30)))
      << "the daemon kept a connection that pings every 100 ms for 30 s";
}

// HTTP/2 frames as the keepalive test reads them (RFC 7540 §4.1).
struct Frame {
  uint8_t type = 0;
  uint8_t flags = 0;
  std::string payload;
};

// Reads one frame within `timeout_ms`; false on EOF, error or timeout.
bool ReadFrame(int fd, int timeout_ms, Frame* frame) {
  auto read_exactly = [&](char* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return false;
      const ssize_t r = read(fd, out + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  unsigned char header[9];
  if (!read_exactly(reinterpret_cast<char*>(header), 9)) return false;
  const size_t length = (size_t{header[0]} << 16) | (size_t{header[1]} << 8) | header[2];
  frame->type = header[3];
  frame->flags = header[4];
  frame->payload.assign(length, '\0');
  return length == 0 || read_exactly(frame->payload.data(), length);
}

TEST(RpcLimitsTest, AConnectionThatDoesNotAnswerKeepalivePingsIsClosed) {
  TestDaemon d("rpc_keepalive");
  d.settings().keepalive_time_ms = 200;
  d.settings().keepalive_timeout_ms = 200;
  d.Start();
  // A raw HTTP/2 client on the Unix socket: the preface and settings (and the acknowledgement of
  // the daemon's settings), then silence: the daemon's pings are never answered.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, d.settings().socket_path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string preface = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                              std::string("\0\0\0\x04\0\0\0\0\0", 9);  // empty SETTINGS
  ASSERT_EQ(write(fd, preface.data(), preface.size()), static_cast<ssize_t>(preface.size()));
  int pings = 0;
  bool goaway = false;
  Frame frame;
  // Until the daemon closes the connection; each read is bounded (30 s), so a daemon that never
  // closes fails the test instead of hanging it.
  while (ReadFrame(fd, 30'000, &frame)) {
    if (frame.type == 4 && (frame.flags & 1) == 0) {  // SETTINGS: acknowledged
      const std::string ack("\0\0\0\x04\x01\0\0\0\0", 9);
      ASSERT_EQ(write(fd, ack.data(), ack.size()), 9);
    }
    if (frame.type == 6 && (frame.flags & 1) == 0) ++pings;  // PING, left unanswered
    if (frame.type == 7) goaway = true;
  }
  // Closed (EOF), not timed out: a read after the end returns 0 at once.
  char byte;
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 0), 1) << "the daemon kept a connection with unanswered pings for 30 s";
  EXPECT_LE(read(fd, &byte, 1), 0);
  close(fd);
  EXPECT_GE(pings, 1) << "the daemon closed the connection without pinging it first";
  (void)goaway;  // gRPC may or may not say goodbye before closing a dead transport
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
