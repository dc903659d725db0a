// Checkpoint round trip, HF-loadability, sharding, bf16 export, retention,
// leftovers, and refusal of every kind of damaged checkpoint with the file named.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/device/cpu_device.h"
#include "engine/model/hf_loader.h"
#include "engine/model/safetensors_reader.h"
#include "engine/train/trainer.h"
#include "tests/checkpoint/small_trainer.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshCheckpointRoot();
    device_ = SmallCheckpointDevice();
    ASSERT_NE(device_, nullptr);
  }

  std::unique_ptr<Trainer> MakeTrainer(bool tied = false) {
    return MakeSmallTrainer(*device_, tied, /*seed=*/3);
  }

  static void TrainSteps(Trainer& t, int steps) {
    std::vector<int32_t> in(11), tg(11);
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < 11; ++i) {
        in[i] = (i * 7 + s * 3) % 53;
        tg[i] = (i * 5 + s + 1) % 53;
      }
      auto r = t.Step({in.data()}, {tg.data()});
      ASSERT_TRUE(r.ok()) << r.status();
    }
    t.WaitForUpdates();
  }

  static std::vector<float> Snapshot(Trainer& t) { return StoreSnapshot(t); }

  std::string Save(Trainer& t, const CheckpointOptions& options = {}) {
    CheckpointRunInfo run;
    run.data_cursor = 17;
    run.seed = 3;
    run.job_json = R"({"steps": 10, "lr": 0.01})";
    run.data_files = {{"/data/a.bin", {1234, 0xdeadbeef}}};
    auto path = WriteCheckpoint(t, root_, run, options);
    EXPECT_TRUE(path.ok()) << path.status();
    return path.ok() ? *path : "";
  }

  std::string root_;
  std::unique_ptr<CpuDevice> device_;
};

TEST_F(CheckpointTest, RoundTripRestoresEveryBufferAndPosition) {
  auto a = MakeTrainer();
  TrainSteps(*a, 2);
  const std::string dir = Save(*a);
  EXPECT_EQ(fs::path(dir).filename(), "step-000000000002");
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors",
                        "trainer_state.json", "manifest.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  }
  auto b = MakeTrainer();
  b->InitializeRandom(99);
  auto loaded = LoadCheckpoint(dir, *b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.data_cursor, 17u);
  EXPECT_EQ(loaded->state.seed, 3u);
  EXPECT_EQ(loaded->state.job_json, R"({"lr":0.01,"steps":10})");
  EXPECT_EQ(loaded->manifest.data_files.size(), 1u);
  EXPECT_EQ(loaded->manifest.data_files[0].checksum.crc32c, 0xdeadbeefu);
  EXPECT_EQ(b->progress().step, 2u);
  EXPECT_EQ(b->progress().applied_updates, 2u);
  const std::vector<float> sa = Snapshot(*a), sb = Snapshot(*b);
  ASSERT_EQ(sa.size(), sb.size());
  EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0);
}

TEST_F(CheckpointTest, ModelFilesLoadAsHuggingFaceWeights) {
  for (bool tied : {false, true}) {
    fs::remove_all(root_);
    auto a = MakeTrainer(tied);
    TrainSteps(*a, 1);
    for (uint64_t shard : {uint64_t{0}, uint64_t{3000}}) {
      CheckpointOptions o;
      o.max_shard_bytes = shard;
      const std::string dir = Save(*a, o);
      EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), shard > 0);
      auto b = MakeTrainer(tied);
      ASSERT_TRUE(b->LoadHfWeights(dir).ok()) << b->LoadHfWeights(dir);
      for (const auto& entry : a->layout().entries()) {
        for (const TensorSlot& slot : entry.tensors) {
          EXPECT_EQ(*a->ReadTensor(slot.hf_name), *b->ReadTensor(slot.hf_name)) << slot.hf_name;
        }
      }
      auto c = MakeTrainer(tied);
      auto loaded = LoadCheckpoint(dir, *c);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(Snapshot(*a), Snapshot(*c));
    }
  }
}

TEST_F(CheckpointTest, Bf16ModelKeepsTheFp32MasterInTheOptimizerFile) {
  auto a = MakeTrainer();
  TrainSteps(*a, 2);
  CheckpointOptions o;
  o.model_dtype = SafetensorsDtype::kBF16;
  const std::string dir = Save(*a, o);
  auto model = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->tensors()[0].dtype, SafetensorsDtype::kBF16);
  auto b = MakeTrainer();
  ASSERT_TRUE(LoadCheckpoint(dir, *b).ok());
  EXPECT_EQ(Snapshot(*a), Snapshot(*b));
}

TEST_F(CheckpointTest, RetentionKeepsTheNewestAndLeftoversAreIgnoredThenRemoved) {
  auto a = MakeTrainer();
  CheckpointOptions o;
  o.keep_last = 2;
  for (int i = 0; i < 4; ++i) {
    TrainSteps(*a, 1);
    Save(*a, o);
  }
  // A writer killed mid-way leaves a temporary directory: never listed.
  fs::create_directories(root_ + "/.tmp-step-000000000009");
  fs::create_directories(root_ + "/.trash-step-000000000001");
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 3u);
  EXPECT_EQ((*list)[1].step, 4u);
  EXPECT_EQ(**LatestCheckpoint(root_), root_ + "/step-000000000004");
  TrainSteps(*a, 1);
  Save(*a, o);
  EXPECT_FALSE(fs::exists(root_ + "/.tmp-step-000000000009"));
  EXPECT_FALSE(fs::exists(root_ + "/.trash-step-000000000001"));
  EXPECT_EQ(ListCheckpoints(root_)->size(), 2u);
  // Saving the same step again replaces it atomically.
  Save(*a, o);
  EXPECT_TRUE(VerifyCheckpointDirectory(root_ + "/step-000000000005").ok());
}

// Retention never deletes the checkpoint just committed, even when a higher step (another run's)
// is beside it; a symlink or a dangling entry in the root is not a checkpoint and does not break
// the listing.
TEST_F(CheckpointTest, RetentionKeepsTheCheckpointJustWrittenAndListingSkipsLinks) {
  auto a = MakeTrainer();
  TrainSteps(*a, 1);
  const std::string earlier = Save(*a);
  fs::rename(earlier, root_ + "/step-000000000300");
  fs::create_directory_symlink(root_ + "/step-000000000300", root_ + "/step-000000000400");
  fs::create_symlink(root_ + "/nowhere", root_ + "/dangling");
  CheckpointOptions o;
  o.keep_last = 1;
  TrainSteps(*a, 1);
  const std::string written = Save(*a, o);
  EXPECT_TRUE(VerifyCheckpointDirectory(written).ok()) << written;
  absl::StatusOr<std::vector<CheckpointListing>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok()) << list.status();
  for (const CheckpointListing& c : *list) EXPECT_NE(c.step, 400u) << "a symlink was listed";
  EXPECT_EQ(**LatestCheckpoint(root_), written);
}

// A FIFO under a checkpoint file's name is refused at once (never waited on for a writer), and
// a symlink is refused where the caller asks for the file itself.
TEST_F(CheckpointTest, ChecksumFileRefusesAFifoAndOnRequestASymlink) {
  fs::create_directories(root_);
  const std::string fifo = root_ + "/model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<FileChecksum> sum = ChecksumFile(fifo);
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("not a regular file"), std::string::npos) << sum.status();
  std::ofstream(root_ + "/real") << "bytes";
  fs::create_symlink(root_ + "/real", root_ + "/link");
  EXPECT_TRUE(ChecksumFile(root_ + "/link").ok());
  EXPECT_FALSE(ChecksumFile(root_ + "/link", /*follow_symlinks=*/false).ok());
}

// Damage one checkpoint in various ways; each load must fail naming the file,
// and leave the target trainer untouched.
class DamagedCheckpointTest : public CheckpointTest {
 protected:
  void ExpectRefused(const std::function<void(const std::string&)>& damage, const std::string& file,
                     const std::string& what) {
    fs::remove_all(root_);
    auto a = MakeTrainer();
    TrainSteps(*a, 1);
    const std::string dir = Save(*a);
    damage(dir);
    auto b = MakeTrainer();
    b->InitializeRandom(77);
    const std::vector<float> before = Snapshot(*b);
    auto loaded = LoadCheckpoint(dir, *b);
    ASSERT_FALSE(loaded.ok()) << file << " / " << what;
    const std::string message(loaded.status().message());
    EXPECT_NE(message.find(dir + "/" + file), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
    EXPECT_EQ(Snapshot(*b), before) << "half-loaded after: " << message;
    EXPECT_EQ(b->progress().step, 0u);
  }
};

void FlipByte(const std::string& path, uint64_t offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff pos = static_cast<std::streamoff>(f.tellg()) - 1 - offset_from_end;
  f.seekg(pos);
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(pos);
  f.write(&c, 1);
}

void ReplaceInFile(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

TEST_F(DamagedCheckpointTest, CorruptedByteIsRefused) {
  ExpectRefused([](const std::string& d) { FlipByte(d + "/optimizer.safetensors", 5); },
                "optimizer.safetensors", "(corrupted)");
  ExpectRefused([](const std::string& d) { FlipByte(d + "/model.safetensors", 100); },
                "model.safetensors", "(corrupted)");
}

TEST_F(DamagedCheckpointTest, TruncatedFileIsRefused) {
  ExpectRefused([](const std::string& d) { fs::resize_file(d + "/model.safetensors", 1000); },
                "model.safetensors", "(truncated)");
}

TEST_F(DamagedCheckpointTest, DeletedFileIsRefused) {
  ExpectRefused([](const std::string& d) { fs::remove(d + "/trainer_state.json"); },
                "trainer_state.json", "missing");
}

TEST_F(DamagedCheckpointTest, UnlistedFileIsRefused) {
  ExpectRefused([](const std::string& d) { std::ofstream(d + "/extra.bin") << "x"; }, "extra.bin",
                "not listed");
}

TEST_F(DamagedCheckpointTest, ManifestDamageAndUnknownVersionAreRefused) {
  ExpectRefused(
      [](const std::string& d) {
        ReplaceInFile(d + "/manifest.json", "\"version\": 1", "\"version\": 2");
      },
      "manifest.json", "version 2 is not supported");
  ExpectRefused(
      [](const std::string& d) {
        ReplaceInFile(d + "/manifest.json", "\"step\": 1", "\"step\": 7");
      },
      "manifest.json", "corrupted");
  ExpectRefused([](const std::string& d) { fs::remove(d + "/manifest.json"); }, "manifest.json",
                "cannot open");
}

TEST_F(DamagedCheckpointTest, OtherModelIsRefused) {
  fs::remove_all(root_);
  auto a = MakeTrainer(/*tied=*/true);
  TrainSteps(*a, 1);
  const std::string dir = Save(*a);
  auto b = MakeTrainer(/*tied=*/false);
  auto loaded = LoadCheckpoint(dir, *b);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(dir + "/config.json"), std::string::npos)
      << loaded.status();
  EXPECT_NE(loaded.status().message().find("tie_word_embeddings"), std::string::npos)
      << loaded.status();
}

// A ZeRO-1 shard's piece of an optimizer tensor (OptimizerPieceName): the writer's form parses
// back; anything else is a whole tensor's name, never a piece.
TEST(OptimizerPieceNameTest, RoundTripsAndRefusesOtherForms) {
  const std::string piece = OptimizerPieceName("m.model.embed_tokens.weight", 65536, 131088);
  EXPECT_EQ(piece, "m.model.embed_tokens.weight[65536:131088]");
  std::string name;
  size_t begin = 0, end = 0;
  ASSERT_TRUE(ParseOptimizerPieceName(piece, &name, &begin, &end));
  EXPECT_EQ(name, "m.model.embed_tokens.weight");
  EXPECT_EQ(begin, 65536u);
  EXPECT_EQ(end, 131088u);
  for (const char* other :
       {"m.model.embed_tokens.weight", "m.x[]", "m.x[1:1]", "m.x[2:1]", "m.x[-1:2]", "m.x[ 1:2]",
        "m.x[1:2", "[0:4]", "m.x[1:+2]", "m.x[1:99999999999999999999]"}) {
    EXPECT_FALSE(ParseOptimizerPieceName(other, &name, &begin, &end)) << other;
  }
}

}  // namespace
}  // namespace megatrain::engine
