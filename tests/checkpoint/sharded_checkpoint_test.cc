// A ZeRO-1 checkpoint's optimizer shards as LoadCheckpoint reads them: pieces of a tensor that
// cover it exactly once load the same bits as the whole tensor; a gap, a short cover, a piece of
// a tensor the model does not have and a tensor both whole and in pieces are refused as
// DATA_LOSS naming the piece, and nothing of the trainer is changed. The shards are cut here
// from a one-process checkpoint and the manifest re-signed with their checksums, so every
// damage reaches the piece checks (a CRC mismatch would stop the load earlier).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/checkpoint/manifest.h"
#include "engine/device/cpu_device.h"
#include "engine/model/safetensors_reader.h"
#include "engine/model/safetensors_writer.h"
#include "engine/train/trainer.h"
#include "tests/checkpoint/small_trainer.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

// One tensor of a shard file: `source`'s elements [begin, end), written as `name`.
struct ShardTensor {
  std::string name;
  std::string source;
  size_t begin = 0;
  size_t end = 0;
};
using Shards = std::vector<std::vector<ShardTensor>>;  // per rank

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshCheckpointRoot();
    device_ = SmallCheckpointDevice();
    ASSERT_NE(device_, nullptr);
    trained_ = MakeSmallTrainer(*device_, /*tied=*/false, /*seed=*/3);
    std::vector<int32_t> in(11), tg(11);
    for (int i = 0; i < 11; ++i) {
      in[i] = (i * 7) % 53;
      tg[i] = (i * 5 + 1) % 53;
    }
    absl::StatusOr<StepReport> r = trained_->Step({in.data()}, {tg.data()});
    ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<std::string> dir = WriteCheckpoint(*trained_, root_, CheckpointRunInfo{}, {});
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    absl::StatusOr<SafetensorsFile> whole =
        SafetensorsFile::Open(absl::StrCat(dir_, "/optimizer.safetensors"));
    ASSERT_TRUE(whole.ok()) << whole.status();
    for (const SafetensorsTensorInfo& t : whole->tensors()) {
      size_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<size_t>(d);
      std::vector<float>& values = optimizer_[t.name];
      values.resize(n);
      ASSERT_TRUE(whole->ReadFloat32(t.name, absl::MakeSpan(values)).ok()) << t.name;
    }
    metadata_ = whole->metadata();
  }

  // Two ranks: rank 0 holds the first half of every optimizer tensor, rank 1 the rest.
  Shards HalvesOfEveryTensor() const {
    Shards shards(2);
    for (const auto& [name, values] : optimizer_) {
      const size_t half = values.size() / 2;
      shards[0].push_back({OptimizerPieceName(name, 0, half), name, 0, half});
      shards[1].push_back({OptimizerPieceName(name, half, values.size()), name, half,
                           values.size()});
    }
    return shards;
  }

  // The manifest without its optimizer files (the whole one or shards written before), which
  // are removed.
  CheckpointManifest DropOptimizerFiles() {
    const std::string manifest_path = absl::StrCat(dir_, "/", kManifestFileName);
    std::ifstream in(manifest_path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<CheckpointManifest> manifest = ParseManifest(text, manifest_path);
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    if (!manifest.ok()) return {};
    std::erase_if(manifest->files, [&](const ManifestFileRecord& f) {
      if (!f.name.starts_with("optimizer")) return false;
      fs::remove(absl::StrCat(dir_, "/", f.name));
      return true;
    });
    return *manifest;
  }

  // Lists `name` (written in the checkpoint) in `manifest` with its checksum.
  void List(CheckpointManifest& manifest, const std::string& name) {
    absl::StatusOr<FileChecksum> sum = ChecksumFile(absl::StrCat(dir_, "/", name));
    ASSERT_TRUE(sum.ok()) << sum.status();
    manifest.files.push_back({name, *sum});
  }

  void SaveManifest(const CheckpointManifest& manifest) {
    std::ofstream(absl::StrCat(dir_, "/", kManifestFileName), std::ios::trunc)
        << ManifestToJson(manifest);
  }

  // Replaces the optimizer file (or the shards written before) by `shards` and lists them in the
  // manifest with their checksums, as WriteShardedCheckpoint's directory would.
  void WriteShards(const Shards& shards) {
    const int world = static_cast<int>(shards.size());
    CheckpointManifest manifest = DropOptimizerFiles();
    for (int r = 0; r < world; ++r) {
      std::vector<TensorToWrite> tensors;
      for (const ShardTensor& t : shards[r]) {
        const std::vector<float>& values = optimizer_.at(t.source);
        tensors.push_back({t.name, SafetensorsDtype::kF32,
                           {static_cast<int64_t>(t.end - t.begin)},
                           absl::MakeSpan(reinterpret_cast<const uint8_t*>(values.data() + t.begin),
                                          (t.end - t.begin) * sizeof(float))});
      }
      const std::string name = OptimizerShardFileName(r, world);
      const std::string path = absl::StrCat(dir_, "/", name);
      ASSERT_TRUE(WriteSafetensors(path, tensors, metadata_).ok()) << path;
      List(manifest, name);
    }
    SaveManifest(manifest);
  }

  // Loads into a fresh trainer; on an error, checks that it names `what` and left the trainer
  // as it was.
  absl::Status Load(std::vector<float>* loaded = nullptr) {
    std::unique_ptr<Trainer> fresh = MakeSmallTrainer(*device_, /*tied=*/false, /*seed=*/77);
    const std::vector<float> before = StoreSnapshot(*fresh);
    absl::StatusOr<LoadedCheckpoint> result = LoadCheckpoint(dir_, *fresh);
    if (!result.ok()) {
      EXPECT_EQ(StoreSnapshot(*fresh), before) << "half-loaded after: " << result.status();
      EXPECT_EQ(fresh->progress().step, 0u);
      return result.status();
    }
    if (loaded != nullptr) *loaded = StoreSnapshot(*fresh);
    return absl::OkStatus();
  }

  static void ExpectDataLoss(const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  }

  std::string root_;
  std::string dir_;
  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<Trainer> trained_;
  std::map<std::string, std::vector<float>> optimizer_;  // the whole checkpoint's tensors
  std::map<std::string, std::string> metadata_;
};

TEST_F(ShardedCheckpointTest, PiecesCoveringEveryTensorLoadTheSameBits) {
  ASSERT_FALSE(optimizer_.empty());
  WriteShards(HalvesOfEveryTensor());
  std::vector<float> loaded;
  ASSERT_TRUE(Load(&loaded).ok());
  EXPECT_EQ(loaded, StoreSnapshot(*trained_));
}

TEST_F(ShardedCheckpointTest, AGapBetweenPiecesIsRefused) {
  Shards shards = HalvesOfEveryTensor();
  ShardTensor& late = shards[1].front();  // starts one element after rank 0's piece ends
  late.begin += 1;
  late.name = OptimizerPieceName(late.source, late.begin, late.end);
  WriteShards(shards);
  const absl::Status s = Load();
  ExpectDataLoss(s, absl::StrCat(late.name, " does not continue ", late.source, "'s pieces"));
  EXPECT_NE(s.message().find(OptimizerShardFileName(1, 2)), std::string::npos) << s;
}

TEST_F(ShardedCheckpointTest, PiecesThatStopShortAreRefused) {
  Shards shards = HalvesOfEveryTensor();
  ShardTensor& short_piece = shards[1].back();
  short_piece.end -= 1;
  short_piece.name = OptimizerPieceName(short_piece.source, short_piece.begin, short_piece.end);
  WriteShards(shards);
  ExpectDataLoss(Load(), absl::StrCat(short_piece.source, ": its pieces cover ",
                                      short_piece.end, " of ", short_piece.end + 1, " elements"));
}

TEST_F(ShardedCheckpointTest, APieceOfATensorTheModelDoesNotHaveIsRefused) {
  for (const std::string source : {"m.model.layers.9.mlp.up_proj.weight", "w.lm_head.weight"}) {
    SCOPED_TRACE(source);
    Shards shards = HalvesOfEveryTensor();
    optimizer_[source] = {1.0f, 2.0f};
    shards[1].push_back({OptimizerPieceName(source, 0, 2), source, 0, 2});
    WriteShards(shards);
    ExpectDataLoss(Load(), absl::StrCat("tensor ", OptimizerPieceName(source, 0, 2),
                                        " is a piece of ", source,
                                        ", which is not in the model's optimizer state"));
    optimizer_.erase(source);
  }
}

// A manifest may name a shard of world -1 (its checksum recomputed): refused naming the file,
// never read as a world of no shards.
TEST_F(ShardedCheckpointTest, AShardOfANegativeWorldIsRefused) {
  CheckpointManifest manifest = DropOptimizerFiles();
  const std::string name = OptimizerShardFileName(0, -1);
  std::ofstream(absl::StrCat(dir_, "/", name)) << "x";
  List(manifest, name);
  SaveManifest(manifest);
  const absl::Status s = Load();
  ExpectDataLoss(s, "is not a shard of a world of ranks");
  EXPECT_NE(s.message().find(name), std::string::npos) << s;
}

TEST_F(ShardedCheckpointTest, ATensorBothWholeAndInPiecesIsRefused) {
  Shards shards = HalvesOfEveryTensor();
  const std::string source = shards[0].front().source;
  shards[0].push_back({source, source, 0, optimizer_.at(source).size()});
  WriteShards(shards);
  ExpectDataLoss(Load(), "is also in pieces");
}

}  // namespace
}  // namespace megatrain::engine
