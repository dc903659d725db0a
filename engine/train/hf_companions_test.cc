// A run that starts from a Hugging Face directory carries the model's tokenizer, chat template
// and generation config into every checkpoint (issue 17, point 6), byte for byte and under the
// manifest's checksums, so a checkpoint loads in transformers as it is.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/checkpoint/manifest.h"
#include "engine/model/hf_loader.h"
#include "engine/train/training_run.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class HfCompanionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/hf_companions";
    fs::remove_all(dir_);
    hf_ = dir_ + "/model";
    fs::create_directories(hf_);
    for (const char* name : {"config.json", "model.safetensors"}) {
      fs::copy_file(std::string("tests/golden/llama_tiny/") + name, hf_ + "/" + name);
    }
    companions_ = {
        {"tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n"},
        {"tokenizer_config.json",
         "{\"chat_template\": \"{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
         "{% endfor %}\", \"eos_token\": \"</s>\"}\n"},
        {"generation_config.json", "{\"eos_token_id\": 2, \"do_sample\": false}\n"},
        {"merges.txt", "#version: 0.2\nt h\nth e\n\xc3\xa9 t\n"},
    };
    for (const auto& [name, text] : companions_) std::ofstream(hf_ + "/" + name) << text;
    std::ofstream tokens(dir_ + "/tokens.u16", std::ios::binary);  // the model's vocabulary is 96
    for (uint16_t i = 0; i < 400; ++i) {
      const uint16_t id = static_cast<uint16_t>((i * 7 + i / 5) % 96);
      tokens.write(reinterpret_cast<const char*>(&id), sizeof(id));
    }
  }

  TrainingRunOptions Options() const {
    TrainingRunOptions o;
    o.token_files = {dir_ + "/tokens.u16"};
    o.token_format = "u16";
    o.init_from_hf_dir = hf_;
    o.trainer.micro_batch_size = 2;
    o.trainer.seq_len = 9;
    o.trainer.collect_timeline = false;
    o.trainer.lr.total_steps = 2;
    o.steps = 2;
    o.eval_every = 0;
    o.eval_batches = 1;
    o.validation_fraction = 0.2;
    o.device.arena_bytes = 64 << 20;
    o.device.pinned_budget_bytes = 256 << 20;
    o.checkpoint_dir = dir_ + "/checkpoints";
    o.checkpoint_every = 1;
    return o;
  }

  std::string dir_, hf_;
  std::vector<std::pair<std::string, std::string>> companions_;
};

TEST_F(HfCompanionsTest, EveryCheckpointCarriesTheTokenizerFilesUnderItsManifest) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(hf_ + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainingRunResult> r = RunTraining(*config, Options(), [](auto&&...) {});
  ASSERT_TRUE(r.ok()) << r.status();
  int checkpoints = 0;
  for (const auto& entry : fs::directory_iterator(dir_ + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    ++checkpoints;
    const std::string cp = entry.path().string();
    absl::StatusOr<CheckpointManifest> manifest = VerifyCheckpointDirectory(cp);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    for (const auto& [file, text] : companions_) {
      EXPECT_EQ(Slurp(cp + "/" + file), text) << cp << "/" << file;
      bool listed = false;
      for (const ManifestFileRecord& f : manifest->files) listed = listed || f.name == file;
      EXPECT_TRUE(listed) << file << " is not in " << cp << "/manifest.json";
    }
    EXPECT_FALSE(fs::exists(cp + "/tokens.u16"));
  }
  EXPECT_EQ(checkpoints, 2);

  // The copies are checked like the weights: a changed tokenizer fails verification.
  std::ofstream(r->last_checkpoint + "/tokenizer.json", std::ios::app) << " ";
  absl::StatusOr<CheckpointManifest> tampered = VerifyCheckpointDirectory(r->last_checkpoint);
  ASSERT_FALSE(tampered.ok());
  EXPECT_THAT(tampered.status().message(), HasSubstr("tokenizer.json"));
}

TEST_F(HfCompanionsTest, AModelWithoutTokenizerFilesWritesCheckpointsWithoutThem) {
  for (const auto& [name, text] : companions_) fs::remove(hf_ + "/" + name);
  absl::StatusOr<ModelConfig> config = LoadModelConfig(hf_ + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainingRunResult> r = RunTraining(*config, Options(), [](auto&&...) {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(VerifyCheckpointDirectory(r->last_checkpoint).ok());
  EXPECT_FALSE(fs::exists(r->last_checkpoint + "/tokenizer.json"));
}

TEST_F(HfCompanionsTest, ATokenizerPathThatIsAFifoFailsTheRunNamingIt) {
  fs::remove(hf_ + "/tokenizer.json");
  ASSERT_EQ(mkfifo((hf_ + "/tokenizer.json").c_str(), 0600), 0);
  absl::StatusOr<ModelConfig> config = LoadModelConfig(hf_ + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainingRunResult> r = RunTraining(*config, Options(), [](auto&&...) {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tokenizer.json"));
}

}  // namespace
}  // namespace megatrain::engine
