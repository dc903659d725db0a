// Provenance end to end: three signed checkpoints from train_local, then each
// kind of tampering the issue names, checked through `megatrain verify`'s exit
// code and output and through the library's findings.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/provenance_verify.h"
#include "engine/provenance/record.h"
#include "engine/provenance/signing_key.h"

namespace megatrain::provenance {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

// Runs a command line (arguments have no spaces or quotes), output captured.
CommandResult Shell(const std::string& command, const std::string& log) {
  const int status = std::system((command + " >" + log + " 2>&1").c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = ReadFile(log);
  return r;
}

std::string Step(int step) { return absl::StrFormat("step-%012d", step); }

class ProvenanceChainTest : public ::testing::Test {
 protected:
  // One training run (3 checkpoints, signed) shared by every test, copied per test.
  static void SetUpTestSuite() {
    work_ = new std::string(std::string(std::getenv("TEST_TMPDIR")) + "/provenance");
    fs::remove_all(*work_);
    fs::create_directories(*work_);
    WriteFile(*work_ + "/config.json", R"({"model_type": "llama", "vocab_size": 256,
        "hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 3, "num_key_value_heads": 1, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5})");
    std::string corpus;
    for (int doc = 0; doc < 97; ++doc) {
      corpus += absl::StrCat("document ", doc, " says ", doc * 7 % 13, " things.\n%\n");
    }
    WriteFile(*work_ + "/corpus.txt", corpus);
    ASSERT_EQ(TrainLocal(*work_ + "/pristine", "--signing_key=" + *work_ + "/daemon.key", 0), 0);
    absl::StatusOr<SigningKey> key = SigningKey::Load(*work_ + "/daemon.key");
    ASSERT_TRUE(key.ok()) << key.status();
    ASSERT_TRUE(key->WritePublicKeyFile(*work_ + "/daemon.pub").ok());
  }
  static void TearDownTestSuite() { delete work_; }

  static int TrainLocal(const std::string& checkpoint_dir, const std::string& extra,
                        int keep_last) {
    return Shell(absl::StrCat("engine/train/train_local --config=", *work_,
                              "/config.json --text=", *work_,
                              "/corpus.txt --steps=3 --micro_batch=2 --seq_len=13 "
                              "--eval_every=0 --threads=1 --arena_mb=16 --checkpoint_every=1 "
                              "--checkpoint_dir=",
                              checkpoint_dir, " --keep_last=", keep_last, " ", extra),
                 *work_ + "/train.log")
        .exit_code;
  }

  void SetUp() override {
    root_ =
        absl::StrCat(*work_, "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::copy(*work_ + "/pristine", root_, fs::copy_options::recursive);
  }

  CommandResult Verify(const std::string& args) {
    return Shell("client/megatrain verify " + args, root_ + ".verify.log");
  }
  std::string Pubkey() const { return " --pubkey " + *work_ + "/daemon.pub"; }

  static std::string* work_;
  std::string root_;
};

std::string* ProvenanceChainTest::work_ = nullptr;

TEST_F(ProvenanceChainTest, UntouchedRunVerifiesWithTheDaemonKey) {
  struct stat st;
  ASSERT_EQ(::stat((*work_ + "/daemon.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const CommandResult run = Verify(root_ + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyOk) << run.output;
  EXPECT_NE(run.output.find("VERIFIED: 3 record(s)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("random initialisation, seed 1"), std::string::npos) << run.output;

  absl::StatusOr<std::string> pub = ReadPublicKeyFile(*work_ + "/daemon.pub");
  ASSERT_TRUE(pub.ok());
  const VerifyReport report = VerifyChain(root_, *pub);
  EXPECT_EQ(report.ExitCode(), kVerifyOk) << FormatVerifyReport(report);
  EXPECT_EQ(report.chain, (std::vector<std::string>{Step(3), Step(2), Step(1)}));
  EXPECT_EQ(report.checkpoints_checked, 3);
  // A single checkpoint directory verifies too.
  EXPECT_EQ(Verify(root_ + "/" + Step(2) + Pubkey()).exit_code, kVerifyOk);
}

// The record names the source commit train_local was built from: the one
// Bazel stamped into //engine/provenance:build_commit for this build.
TEST_F(ProvenanceChainTest, RecordNamesTheStampedSourceCommit) {
  const std::string stamped =
      ReadFile(std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") +
               "/engine/provenance/build_commit.cc");
  const size_t open = stamped.find("return \"");
  ASSERT_NE(open, std::string::npos) << stamped;
  const std::string commit = stamped.substr(open + 8, stamped.find('"', open + 8) - (open + 8));
  const nlohmann::json record =
      nlohmann::json::parse(ReadFile(root_ + "/" + Step(3) + "/provenance.json"));
  EXPECT_EQ(record["lineage"]["build"]["commit"], commit);
  EXPECT_NE(commit, "") << "the stamp is empty";
}

TEST_F(ProvenanceChainTest, FlippedTensorByteNamesTheFileAndTheTensor) {
  const std::string dir = root_ + "/" + Step(2);
  const nlohmann::json record = nlohmann::json::parse(ReadFile(dir + "/provenance.json"));
  const nlohmann::json* model = nullptr;
  for (const nlohmann::json& f : record["files"]) {
    if (f["name"] == "model.safetensors") model = &f;
  }
  ASSERT_NE(model, nullptr);
  ASSERT_GE((*model)["tensors"].size(), 3u);
  const nlohmann::json& tensor = (*model)["tensors"][2];
  const std::string name = tensor["name"];
  const uint64_t at = (tensor["begin"].get<uint64_t>() + tensor["end"].get<uint64_t>()) / 2;
  std::string bytes = ReadFile(dir + "/model.safetensors");
  bytes[at] ^= 0x10;
  WriteFile(dir + "/model.safetensors", bytes);

  const CommandResult run = Verify(root_ + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyFailed) << run.output;
  EXPECT_NE(run.output.find(Step(2) + "/model.safetensors tensor " + name + ":"), std::string::npos)
      << run.output;
  const VerifyReport report = VerifyChain(root_, std::nullopt);
  int tensors = 0;
  for (const VerifyFinding& f : report.findings) {
    if (f.kind != FindingKind::kTensorMismatch) continue;
    ++tensors;
    EXPECT_EQ(f.file, "model.safetensors");
    EXPECT_EQ(f.tensor, name);
    EXPECT_EQ(f.checkpoint, Step(2));
  }
  EXPECT_EQ(tensors, 1) << FormatVerifyReport(report);
}

TEST_F(ProvenanceChainTest, EditedRecordFailsItsSignature) {
  const std::string path = root_ + "/" + Step(2) + "/provenance.json";
  std::string text = ReadFile(path);
  const size_t at = text.find("\"device_kind\": \"cpu\"");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 20, "\"device_kind\": \"gpu\"");
  WriteFile(path, text);
  const CommandResult run = Verify(root_ + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyFailed) << run.output;
  EXPECT_NE(run.output.find("[bad_signature] " + Step(2) + "/provenance.sig"), std::string::npos)
      << run.output;
  // The next record's link no longer matches either.
  EXPECT_NE(run.output.find("[chain_mismatch] " + Step(3)), std::string::npos) << run.output;
}

TEST_F(ProvenanceChainTest, RecordsResignedByAnotherKeyAreRefusedByTheDaemonKey) {
  absl::StatusOr<SigningKey> other = SigningKey::Generate();
  ASSERT_TRUE(other.ok());
  for (int step : {1, 2, 3}) {
    const std::string dir = root_ + "/" + Step(step);
    WriteFile(dir + "/provenance.sig",
              SignatureToJson(SignProvenance(*other, ReadFile(dir + "/provenance.json"))));
  }
  // Consistent on its own (all by the other key), but not by the daemon's key.
  EXPECT_EQ(Verify(root_).exit_code, kVerifyOk);
  const CommandResult run = Verify(root_ + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyFailed) << run.output;
  EXPECT_NE(run.output.find("[wrong_key]"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("not by the --pubkey key"), std::string::npos) << run.output;
}

TEST_F(ProvenanceChainTest, RemovedMiddleCheckpointIsNamedAsAChainBreak) {
  fs::remove_all(root_ + "/" + Step(2));
  fs::remove_all(root_ + "/lineage");  // no record kept for it either
  const CommandResult run = Verify(root_ + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyFailed) << run.output;
  EXPECT_NE(run.output.find("[chain_break] " + Step(3) + "/provenance.json: " + Step(3) +
                            " links to " + Step(2) + ", whose record is missing"),
            std::string::npos)
      << run.output;
}

TEST_F(ProvenanceChainTest, RetentionKeepsTheChainVerifiable) {
  const std::string pruned = root_ + "-pruned";
  fs::remove_all(pruned);
  ASSERT_EQ(TrainLocal(pruned, "--signing_key=" + *work_ + "/daemon.key", 1), 0);
  ASSERT_FALSE(fs::exists(pruned + "/" + Step(1)));
  ASSERT_TRUE(fs::exists(pruned + "/lineage/" + Step(1) + ".provenance.json"));
  CommandResult run = Verify(pruned + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyOk) << run.output;
  EXPECT_NE(run.output.find("[pruned_by_retention] lineage/" + Step(2)), std::string::npos)
      << run.output;
  // Without its kept record, the pruned checkpoint is a break.
  fs::remove(pruned + "/lineage/" + Step(2) + ".provenance.json");
  run = Verify(pruned + Pubkey());
  EXPECT_EQ(run.exit_code, kVerifyFailed) << run.output;
  EXPECT_NE(run.output.find("[chain_break]"), std::string::npos) << run.output;
}

TEST_F(ProvenanceChainTest, UnsignedRunExitsThreeAndUsageErrorsExitTwo) {
  const std::string unsigned_root = root_ + "-unsigned";
  fs::remove_all(unsigned_root);
  ASSERT_EQ(TrainLocal(unsigned_root, "", 0), 0);
  CommandResult run = Verify(unsigned_root);
  EXPECT_EQ(run.exit_code, kVerifyUnsigned) << run.output;
  EXPECT_NE(run.output.find("VERIFIED (UNSIGNED)"), std::string::npos) << run.output;
  // A demanded signature that is absent is a failure, not "unsigned".
  EXPECT_EQ(Verify(unsigned_root + Pubkey()).exit_code, kVerifyFailed);
  EXPECT_EQ(Verify(root_ + "/does-not-exist").exit_code, kVerifyUsage);
  EXPECT_EQ(Verify("").exit_code, kVerifyUsage);
  EXPECT_EQ(Verify(root_ + " --pubkey " + root_ + "/missing.pub").exit_code, kVerifyUsage);
  run = Verify(root_ + Pubkey() + " --json");
  EXPECT_EQ(run.exit_code, kVerifyOk);
  const nlohmann::json j = nlohmann::json::parse(run.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << run.output;
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["chain"].size(), 3u);
}

}  // namespace
}  // namespace megatrain::provenance
