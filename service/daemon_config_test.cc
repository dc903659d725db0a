// Tests of DaemonConfig parsing, defaults and validation.
#include "service/daemon_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::service {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kMinimal[] = R"pb(
  config_version: 1
  state_dir: "/var/lib/megatrain"
  socket_path: "/run/megatrain/megatraind.sock"
  data_roots: "/srv/data"
  output_roots: "/srv/out"
)pb";

TEST(DaemonConfigTest, MinimalConfigGetsDefaults) {
  absl::StatusOr<v1::DaemonConfig> c = ParseDaemonConfigText(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<DaemonSettings> s = ValidateDaemonConfig(*c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->socket_mode, 0660u);
  EXPECT_EQ(s->device.kind, engine::DeviceKind::kCpu);
  EXPECT_EQ(s->device.arena_bytes, size_t{512} << 20);
  EXPECT_EQ(s->max_queue_length, 64u);
  EXPECT_EQ(s->shutdown_timeout_seconds, 60u);
}

TEST(DaemonConfigTest, RefusesOtherVersions) {
  absl::StatusOr<v1::DaemonConfig> c = ParseDaemonConfigText(kMinimal);
  ASSERT_TRUE(c.ok());
  c->set_config_version(7);
  absl::StatusOr<DaemonSettings> s = ValidateDaemonConfig(*c);
  EXPECT_THAT(s.status().message(), HasSubstr("config_version"));
}

TEST(DaemonConfigTest, UnknownFieldIsAParseError) {
  absl::StatusOr<v1::DaemonConfig> c = ParseDaemonConfigText("config_version: 1\nbogus: 3\n");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("bogus"));
}

TEST(DaemonConfigTest, TcpWithoutTlsOrTokenRefused) {
  absl::StatusOr<v1::DaemonConfig> c =
      ParseDaemonConfigText(std::string(kMinimal) + "tcp_address: \"0.0.0.0:7070\"");
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("tls_cert_file"));
  c->set_tls_cert_file("/c.pem");
  c->set_tls_key_file("/k.pem");
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("token_file"));
  c->set_token_file("/token");
  EXPECT_TRUE(ValidateDaemonConfig(*c).ok());
}

TEST(DaemonConfigTest, MetricsOnlyOnLoopbackAndPathsAbsolute) {
  absl::StatusOr<v1::DaemonConfig> c =
      ParseDaemonConfigText(std::string(kMinimal) + "metrics_address: \"0.0.0.0:9464\"");
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("metrics_address"));
  c->set_metrics_address("127.0.0.1:0");
  c->set_state_dir("relative/dir");
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("state_dir"));
  c->set_state_dir("/ok");
  c->set_link_gbps(-1);
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("link_gbps"));
}

TEST(DaemonConfigTest, AnExposedMetricsListenerNeedsTlsAndAToken) {
  absl::StatusOr<v1::DaemonConfig> c =
      ParseDaemonConfigText(std::string(kMinimal) + "metrics_address: \"0.0.0.0:9443\"");
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(),
              AllOf(HasSubstr("metrics_address"), HasSubstr("tls_cert_file")));
  c->set_tls_cert_file("/c.pem");
  c->set_tls_key_file("/k.pem");
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(),
              AllOf(HasSubstr("metrics_address"), HasSubstr("token_file")));
  c->set_token_file("/token");
  absl::StatusOr<DaemonSettings> s = ValidateDaemonConfig(*c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->metrics_exposed);
  EXPECT_EQ(s->max_event_streams, 2u);
  EXPECT_EQ(s->dashboard_session_minutes, 720u);
  // Loopback: not exposed unless forced, and forcing needs the same fields.
  c->set_metrics_address("127.0.0.1:0");
  EXPECT_FALSE(ValidateDaemonConfig(*c)->metrics_exposed);
  c->set_metrics_exposed(true);
  EXPECT_TRUE(ValidateDaemonConfig(*c)->metrics_exposed);
  c->clear_token_file();
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(),
              AllOf(HasSubstr("metrics_exposed"), HasSubstr("token_file")));
  c->set_token_file("/token");
  c->add_dashboard_host_names("trainer.example:443");
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("dashboard_host_names"));
  c->clear_dashboard_host_names();
  c->set_max_event_streams(65);
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("max_event_streams"));
  c->set_max_event_streams(0);
  c->set_dashboard_session_minutes(10081);
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("dashboard_session_minutes"));
}

TEST(DaemonConfigTest, DriveWearIsOffByDefaultAndNeedsTheRatedTbw) {
  absl::StatusOr<v1::DaemonConfig> c = ParseDaemonConfigText(kMinimal);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<DaemonSettings> s = ValidateDaemonConfig(*c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->drive_wear.enabled());
  c->set_nvme_wear_warn_share(0.2);
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(),
              HasSubstr("nvme_wear_warn_share: 0.2 without nvme_rated_tbw_bytes"));
  c->set_nvme_rated_tbw_bytes(uint64_t{600} * 1000 * 1000 * 1000 * 1000);
  s = ValidateDaemonConfig(*c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->drive_wear.enabled());
  EXPECT_DOUBLE_EQ(s->drive_wear.warn_share, 0.2);
  c->set_nvme_wear_warn_share(1.5);
  EXPECT_THAT(ValidateDaemonConfig(*c).status().message(), HasSubstr("nvme_wear_warn_share=1.5"));
  c->set_nvme_wear_warn_share(0);  // the default share
  s = ValidateDaemonConfig(*c);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->drive_wear.warn_share, 0.1);
  // Parsed from text too.
  c = ParseDaemonConfigText(std::string(kMinimal) +
                            "nvme_rated_tbw_bytes: 1000000000000000\nnvme_wear_warn_share: 0.05");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(ValidateDaemonConfig(*c)->drive_wear.rated_tbw_bytes, 1000000000000000u);
}

TEST(DaemonConfigTest, GrpcLimitsAreCheckedNamingTheFlag) {
  DaemonSettings settings;
  EXPECT_TRUE(ValidateGrpcLimits(settings).ok());
  settings.max_concurrent_streams = 0;
  absl::Status s = ValidateGrpcLimits(settings);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--max_concurrent_streams=0 is outside [1, 10000]");
  settings = DaemonSettings();
  settings.max_connection_idle_ms = 10;
  EXPECT_THAT(ValidateGrpcLimits(settings).message(),
              ::testing::HasSubstr("max_connection_idle_ms=10"));
}

}  // namespace
}  // namespace megatrain::service
