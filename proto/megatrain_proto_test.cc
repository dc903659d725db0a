// Round-trips a JobSpec through the wire format and text format, so a broken
// proto build or a renamed field is caught before any server code runs.
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "proto/megatrain.grpc.pb.h"
#include "proto/megatrain.pb.h"

namespace megatrain::v1 {
namespace {

TEST(MegatrainProtoTest, JobSpecRoundTripsThroughWireFormat) {
  JobSpec spec;
  spec.set_name("tiny");
  spec.mutable_model()->set_hf_directory("/models/tiny");
  spec.mutable_hyper()->set_steps(100);
  spec.mutable_hyper()->mutable_lr()->set_peak_lr(3e-4);
  spec.mutable_hyper()->mutable_lr()->set_decay(LrSchedule::COSINE);
  spec.mutable_memory()->set_ram_bytes(uint64_t{1} << 34);

  std::string wire;
  ASSERT_TRUE(spec.SerializeToString(&wire));
  JobSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.model().hf_directory(), "/models/tiny");
  EXPECT_EQ(parsed.hyper().steps(), 100u);
  EXPECT_DOUBLE_EQ(parsed.hyper().lr().peak_lr(), 3e-4);
  EXPECT_EQ(parsed.hyper().lr().decay(), LrSchedule::COSINE);
  EXPECT_EQ(parsed.memory().ram_bytes(), uint64_t{1} << 34);
}

TEST(MegatrainProtoTest, JobSpecParsesFromTextFormat) {
  JobSpec spec;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(R"pb(name: "t"
                                                         hyper { steps: 7 seq_len: 256 })pb",
                                                    &spec));
  EXPECT_EQ(spec.hyper().steps(), 7u);
  EXPECT_EQ(spec.hyper().seq_len(), 256u);
}

TEST(MegatrainProtoTest, ServiceDeclaresEveryMethod) {
  const auto* service = JobSpec::descriptor()->file()->FindServiceByName("Trainer");
  ASSERT_NE(service, nullptr);
  for (const char* method :
       {"SubmitJob", "GetJob", "ListJobs", "WatchJob", "CancelJob", "PauseJob", "ResumeJob",
        "Checkpoint", "ListCheckpoints", "Plan", "GetDaemonStatus"}) {
    EXPECT_NE(service->FindMethodByName(method), nullptr) << method;
  }
  EXPECT_TRUE(service->FindMethodByName("WatchJob")->server_streaming());
}

}  // namespace
}  // namespace megatrain::v1
