// A device fault during a job (the fake engine reports it as the CPU device's InjectFault or a
// sticky CUDA error would): the job fails with the reason, the daemon reports itself unhealthy in
// GetDaemonStatus and the metrics, refuses new jobs, and leaves queued jobs queued.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_daemon.h"

namespace megatrain::server::testing {
namespace {

using ::testing::HasSubstr;

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    (void)!write(fd, request.data(), request.size());
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  }
  close(fd);
  return response;
}

TEST(DeviceFaultTest, FaultFailsJobAndMakesDaemonUnhealthy) {
  TestDaemon daemon("device_fault");
  daemon.settings().metrics_address = "127.0.0.1:0";
  daemon.Start();
  ASSERT_THAT(HttpGet(daemon.daemon().metrics_port(), "/metrics"),
              HasSubstr("megatrain_daemon_healthy 1"));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = daemon.ValidSpec(10'000'000);
  v1::Job first, second;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(daemon.stub().SubmitJob(&context, submit, &first).ok());
  }
  {
    grpc::ClientContext context;
    *submit.mutable_spec() = daemon.ValidSpec(10'000'000);  // its own output directory
    ASSERT_TRUE(daemon.stub().SubmitJob(&context, submit, &second).ok());
  }
  daemon.AwaitState(first.id(), v1::RUNNING, 1);
  daemon.engine().InjectFault();
  v1::Job failed = daemon.AwaitState(first.id(), v1::FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("device fault: injected by the test"));

  grpc::ClientContext status_context;
  v1::DaemonStatus status;
  ASSERT_TRUE(
      daemon.stub().GetDaemonStatus(&status_context, v1::GetDaemonStatusRequest(), &status).ok());
  EXPECT_FALSE(status.healthy());
  EXPECT_THAT(status.unhealthy_reason(), HasSubstr("device fault"));
  EXPECT_EQ(status.queue_length(), 1u);
  EXPECT_EQ(status.running_job_id(), "");

  grpc::ClientContext refused_context;
  v1::Job refused;
  grpc::Status s = daemon.stub().SubmitJob(&refused_context, submit, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("unhealthy"));

  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_id(second.id());
  v1::Job still_queued;
  ASSERT_TRUE(daemon.stub().GetJob(&get_context, get, &still_queued).ok());
  EXPECT_EQ(still_queued.state(), v1::QUEUED);

  const std::string metrics = HttpGet(daemon.daemon().metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("megatrain_daemon_healthy 0"));
  EXPECT_THAT(metrics, HasSubstr("megatrain_daemon_jobs{state=\"FAILED\"} 1"));
  EXPECT_THAT(
      metrics,
      HasSubstr(
          "megatrain_daemon_rpcs_total{code=\"FAILED_PRECONDITION\",method=\"SubmitJob\"} 1"));
  EXPECT_THAT(HttpGet(daemon.daemon().metrics_port(), "/other"), HasSubstr("404"));
}

}  // namespace
}  // namespace megatrain::server::testing
