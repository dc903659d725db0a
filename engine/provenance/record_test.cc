// ProvenanceRecord and SignatureRecord: JSON round trips and strict parsing.
#include "engine/provenance/record.h"

#include <gtest/gtest.h>

namespace megatrain::provenance {
namespace {

ProvenanceRecord Sample(PreviousLink previous) {
  ProvenanceRecord r;
  r.step = 42;
  r.files = {{"config.json", 17, std::string(64, '1'), {}},
             {"model.safetensors",
              1000,
              std::string(64, '2'),
              {{"a.weight", 96, 500, std::string(64, '3')},
               {"b.weight", 500, 1000, std::string(64, '4')}}}};
  r.lineage.job_spec_json = "{}";
  r.lineage.inputs = {{kRoleBaseModel, "/base/model.safetensors", std::string(64, '5'), 9}};
  r.lineage.device_kind = "cpu";
  r.previous = std::move(previous);
  return r;
}

TEST(RecordTest, RoundTripsEveryKindOfPreviousLink) {
  PreviousLink checkpoint;
  checkpoint.kind = PreviousLink::Kind::kCheckpoint;
  checkpoint.step = 41;
  checkpoint.dir_name = "step-000000000041";
  checkpoint.provenance_sha256_hex = std::string(64, 'e');
  PreviousLink unrecorded;
  unrecorded.reason = "no context";
  const Lineage lineage = Sample({}).lineage;
  for (const PreviousLink& link :
       {checkpoint, BaseModelOrigin("/base", lineage.inputs), RandomInitOrigin(7), unrecorded}) {
    const ProvenanceRecord r = Sample(link);
    absl::StatusOr<ProvenanceRecord> parsed = ParseProvenance(ProvenanceToJson(r), "p.json");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, r) << PreviousKindName(link.kind);
  }
  const PreviousLink base = BaseModelOrigin("/base", lineage.inputs);
  ASSERT_EQ(base.base_files.size(), 1u);
  EXPECT_EQ(base.base_files[0].path, "model.safetensors");
}

TEST(RecordTest, StrictParsingRefusesBadRecords) {
  const std::string good = ProvenanceToJson(Sample(RandomInitOrigin(1)));
  nlohmann::json j = nlohmann::json::parse(good);
  j["version"] = 2;
  EXPECT_FALSE(ParseProvenance(j.dump(), "p").ok());
  j = nlohmann::json::parse(good);
  j["files"][1]["tensors"][0]["end"] = 5000;  // beyond the file
  absl::StatusOr<ProvenanceRecord> range = ParseProvenance(j.dump(), "p");
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("p.files[1].tensors[0]"), std::string::npos);
  j = nlohmann::json::parse(good);
  j["files"][0]["name"] = "../escape";
  EXPECT_FALSE(ParseProvenance(j.dump(), "p").ok());
  j = nlohmann::json::parse(good);
  j["previous"]["kind"] = "magic";
  EXPECT_FALSE(ParseProvenance(j.dump(), "p").ok());
}

TEST(RecordTest, SignatureRoundTripVerifies) {
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  const std::string json = ProvenanceToJson(Sample(RandomInitOrigin(1)));
  const SignatureRecord sig = SignProvenance(*key, json);
  absl::StatusOr<SignatureRecord> parsed = ParseSignature(SignatureToJson(sig), "s");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->public_key_hex, key->public_key_hex());
  EXPECT_EQ(parsed->signature_hex, sig.signature_hex);
  EXPECT_FALSE(ParseSignature(R"({"format":"x"})", "s").ok());
}

}  // namespace
}  // namespace megatrain::provenance
