// Tests of the hardware profile table: the built-in file parses, user files extend it, and bad
// fields are refused by name.
#include "engine/planner/hardware_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace megatrain::engine::planner {
namespace {

TEST(HardwareProfileTest, BuiltinTableHasTheDocumentedGpus) {
  const std::vector<HardwareProfile> p = BuiltinHardwareProfiles();
  for (const char* name :
       {"h100-sxm", "h100-pcie", "h200", "gh200", "b200", "rtx4090", "a100-80gb"}) {
    absl::StatusOr<HardwareProfile> h = FindHardwareProfile(p, name);
    ASSERT_TRUE(h.ok()) << name;
    EXPECT_GT(h->device_memory_bytes, uint64_t{20} << 30) << name;
    EXPECT_GT(h->dense_tflops, 100) << name;
    EXPECT_GT(h->h2d_gbps, 10) << name;
    EXPECT_GT(h->host_memory_gbps, 50) << name;
    EXPECT_FALSE(h->cpu_device);
  }
  const HardwareProfile gh200 = *FindHardwareProfile(p, "gh200");
  EXPECT_GT(gh200.h2d_gbps, 5 * FindHardwareProfile(p, "h100-pcie")->h2d_gbps);
}

// Every built-in profile states its peer and network links (data_parallel.h); on NVLink
// the peers are faster than the host link, over PCIe they are not.
TEST(HardwareProfileTest, BuiltinProfilesGiveTheirPeerAndNetworkLinks) {
  const std::vector<HardwareProfile> p = BuiltinHardwareProfiles();
  for (const HardwareProfile& h : p) {
    EXPECT_GT(h.peer_gbps, 0) << h.name;
    EXPECT_GT(h.network_gbps, 0) << h.name;
  }
  EXPECT_EQ(FindHardwareProfile(p, "h100-sxm")->peer_gbps, 450);
  EXPECT_EQ(FindHardwareProfile(p, "h100-sxm")->network_gbps, 50);
  EXPECT_GT(FindHardwareProfile(p, "h100-sxm")->peer_gbps,
            FindHardwareProfile(p, "h100-sxm")->h2d_gbps);
  EXPECT_EQ(FindHardwareProfile(p, "h100-pcie")->peer_gbps,
            FindHardwareProfile(p, "h100-pcie")->h2d_gbps);
  auto negative = ParseHardwareProfiles(
      R"({"profiles": [{"name": "x", "device_memory_bytes": 1, "dense_tflops": 1,
          "device_memory_gbps": 1, "h2d_gbps": 1, "d2h_gbps": 1, "host_memory_gbps": 1,
          "peer_gbps": -1}]})");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("peer_gbps"), std::string::npos);
}

TEST(HardwareProfileTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<HardwareProfile> h = FindHardwareProfile(BuiltinHardwareProfiles(), "tpu-v9");
  ASSERT_EQ(h.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(h.status().message().find("h100-pcie"), std::string::npos);
}

TEST(HardwareProfileTest, BadFieldsAreNamed) {
  auto unknown = ParseHardwareProfiles(
      R"({"profiles": [{"name": "x", "device_memory_bytes": 1, "dense_tflops": 1,
          "device_memory_gbps": 1, "h2d_gbps": 1, "d2h_gbps": 1, "host_memory_gbps": 1,
          "tflops": 3}]})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("tflops"), std::string::npos);
  auto missing = ParseHardwareProfiles(R"({"profiles": [{"name": "x", "dense_tflops": 1}]})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("device_memory_bytes"), std::string::npos);
  auto negative = ParseHardwareProfiles(
      R"({"profiles": [{"name": "x", "device_memory_bytes": 1, "dense_tflops": -1}]})");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("dense_tflops=-1"), std::string::npos);
  EXPECT_FALSE(ParseHardwareProfiles("not json").ok());
}

TEST(HardwareProfileTest, UserFileOverridesAndExtends) {
  const std::string path = ::testing::TempDir() + "/profiles_test.json";
  std::ofstream(path) << R"({"profiles": [
      {"name": "h100-pcie", "device_memory_bytes": 1000, "dense_tflops": 1, "device_memory_gbps": 1,
       "h2d_gbps": 7, "d2h_gbps": 7, "host_memory_gbps": 1},
      {"name": "mi300x", "device_memory_bytes": 206158430208, "dense_tflops": 1307,
       "device_memory_gbps": 5300, "h2d_gbps": 55, "d2h_gbps": 55, "host_memory_gbps": 300}]})";
  const size_t builtin = BuiltinHardwareProfiles().size();
  auto p = ExtendHardwareProfiles(BuiltinHardwareProfiles(), path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), builtin + 1);
  EXPECT_EQ(FindHardwareProfile(*p, "h100-pcie")->h2d_gbps, 7);
  EXPECT_EQ(FindHardwareProfile(*p, "mi300x")->dense_tflops, 1307);
  EXPECT_FALSE(ExtendHardwareProfiles({}, path + ".missing").ok());
}

}  // namespace
}  // namespace megatrain::engine::planner
