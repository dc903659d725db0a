// SdNotifier and SdWatchdog against a real datagram socket standing in for systemd's: READY,
// the abstract namespace, malformed variables named, the watchdog's interval and its pings only
// while the probe answers. Waits are bounded receives, never sleeps.
#include "server/sd_notify.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sd_watchdog.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

// A bound datagram socket: systemd's side.
class FakeSystemd {
 public:
  explicit FakeSystemd(const std::string& address) : fd_(socket(AF_UNIX, SOCK_DGRAM, 0)) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::string bytes = address;
    if (bytes[0] == '@') bytes[0] = '\0';
    std::memcpy(a.sun_path, bytes.data(), bytes.size());
    if (bytes[0] == '/') unlink(bytes.c_str());
    EXPECT_EQ(bind(fd_.get(), reinterpret_cast<sockaddr*>(&a),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + bytes.size())),
              0)
        << std::strerror(errno);
  }
  // The next datagram within `timeout_ms`, or "TIMEOUT".
  std::string Receive(int timeout_ms = 30'000) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return "TIMEOUT";
    char buffer[512];
    const ssize_t n = recv(fd_.get(), buffer, sizeof(buffer), 0);
    return n < 0 ? "ERROR" : std::string(buffer, static_cast<size_t>(n));
  }

 private:
  engine::UniqueFd fd_;
};

std::string SocketPath(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  if (path.size() > 100) path = std::string("/tmp/") + name;  // sun_path holds 108 bytes
  return path;
}

TEST(SdNotifierTest, SendsStatesToThePathAndTheAbstractNamespace) {
  const std::string path = SocketPath("notify.sock");
  FakeSystemd systemd(path);
  absl::StatusOr<SdNotifier> n = SdNotifier::Create(path.c_str(), nullptr, nullptr, getpid());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->enabled());
  EXPECT_EQ(n->watchdog_interval(), absl::ZeroDuration());
  ASSERT_TRUE(n->Notify("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(systemd.Receive(), "READY=1\nSTATUS=serving");

  const std::string abstract = "@megatrain-sd-notify-test-" + std::to_string(getpid());
  FakeSystemd abstract_systemd(abstract);
  absl::StatusOr<SdNotifier> a = SdNotifier::Create(abstract.c_str(), nullptr, nullptr, getpid());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->Notify("STOPPING=1").ok());
  EXPECT_EQ(abstract_systemd.Receive(), "STOPPING=1");
}

TEST(SdNotifierTest, OutsideSystemdItIsInertAndBadValuesAreNamed) {
  absl::StatusOr<SdNotifier> off = SdNotifier::Create(nullptr, nullptr, nullptr, getpid());
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  EXPECT_TRUE(off->Notify("READY=1").ok());
  absl::StatusOr<SdNotifier> bad = SdNotifier::Create("relative.sock", nullptr, nullptr, 1);
  EXPECT_THAT(bad.status().message(), HasSubstr("NOTIFY_SOCKET: 'relative.sock'"));
  bad = SdNotifier::Create("/run/x", "soon", nullptr, 1);
  EXPECT_THAT(bad.status().message(), HasSubstr("WATCHDOG_USEC: 'soon'"));
  absl::StatusOr<SdNotifier> other = SdNotifier::Create("/run/x", "1000000", "12345", 1);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->watchdog_interval(), absl::ZeroDuration());  // another process's watchdog
  absl::StatusOr<SdNotifier> ours = SdNotifier::Create("/run/x", "1000000", "7", 7);
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(ours->watchdog_interval(), absl::Seconds(1));
}

TEST(SdWatchdogTest, PingsWhileTheProbeAnswers) {
  const std::string path = SocketPath("watchdog.sock");
  FakeSystemd systemd(path);
  absl::StatusOr<SdNotifier> n = SdNotifier::Create(path.c_str(), "200000", nullptr, getpid());
  ASSERT_TRUE(n.ok()) << n.status();
  StructuredLog log(stderr);
  std::atomic<int> probes{0};
  {
    SdWatchdog watchdog(*n, log, [&] {
      ++probes;
      return true;
    });
    EXPECT_EQ(systemd.Receive(), "WATCHDOG=1");
    EXPECT_EQ(systemd.Receive(), "WATCHDOG=1");
  }
  EXPECT_GE(probes.load(), 2);
  // A probe that never answers (a stuck lock) means no ping: the watchdog thread waits in it.
  std::atomic<bool> release{false};
  {
    SdWatchdog stuck(*n, log, [&] {
      while (!release) {
        pollfd none{-1, 0, 0};
        poll(&none, 0, 10);  // stands in for a lock that is never released
      }
      return false;
    });
    EXPECT_EQ(systemd.Receive(1000), "TIMEOUT");  // the absence is asserted over a bound only
    release = true;
  }
}

}  // namespace
}  // namespace megatrain::server
