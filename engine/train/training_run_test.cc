// Tests for text training on JSONL with a SentencePiece tokenizer: a short
// run works end to end, and bad data or a too-small vocabulary is refused.
#include "engine/train/training_run.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include "engine/data/sample_batches.h"
#include "engine/data/sample_set_file.h"
#include "engine/data/sentencepiece_test_model.h"
#include "engine/data/text_tokenizer.h"
#include "engine/exec/executor_geometry.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/parameter_layout.h"
#include "engine/model/safetensors_reader.h"
#include "engine/train/training_data.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

class TextTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    const char* lines[] = {"the quick brown fox jumps over the lazy dog",
                           "a stitch in time saves nine", "all that glitters is not gold",
                           "actions speak louder than words"};
    std::ofstream plain(dir_ + "/spm.txt");
    std::ofstream jsonl(dir_ + "/corpus.jsonl");
    for (int repeat = 0; repeat < 9; ++repeat) {
      for (const char* line : lines) {
        plain << line << "\n";
        jsonl << "{\"text\": \"" << line << "\", \"n\": " << repeat << "}\n";
      }
    }
    plain.close();
    std::string error;
    ASSERT_TRUE(TrainTinySentencePieceModel(dir_ + "/spm.txt", dir_ + "/spm", 47, &error)) << error;
    model_ = dir_ + "/spm.model";
  }

  TrainingRunOptions Options() const {
    TrainingRunOptions o;
    o.text_paths = {dir_ + "/corpus.jsonl"};
    o.tokenizer = model_;
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
    return o;
  }

  ModelConfig Config(int64_t vocab) const {
    ModelConfig c = TinyTextModelConfig();
    c.vocab_size = vocab;
    c.hidden_size = 24;
    c.intermediate_size = 37;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 3;
    c.num_key_value_heads = 1;
    c.head_dim = 8;
    return c;
  }

  std::string dir_;
  std::string model_;
};

TEST_F(TextTrainingTest, TrainsOnJsonlWithSentencePiece) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = CreateTextTokenizer(model_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int vocab = (*tok)->vocab_size();
  absl::StatusOr<TrainingRunResult> r =
      RunTraining(Config(vocab), Options(), [](const std::string&, bool) {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps_run, 2u);
  // An untrained model is close to uniform over the tokenizer's vocabulary.
  EXPECT_NEAR(r->initial_validation_loss, std::log(vocab), 0.5);
  EXPECT_GT(r->unigram_entropy_nats, 0);
  EXPECT_TRUE(std::isfinite(r->final_validation_loss));
  EXPECT_THAT(TrainingJobJson(Options()), HasSubstr(model_));
}

// validation_fraction 0 holds nothing out: every window trains, nothing is evaluated, and the
// validation loss is NaN (before, evaluation divided by zero validation windows).
TEST_F(TextTrainingTest, ValidationFractionZeroTrainsWithoutEvaluating) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = CreateTextTokenizer(model_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  TrainingRunOptions o = Options();
  o.validation_fraction = 0;
  o.eval_every = 1;
  std::vector<std::string> lines;
  absl::StatusOr<TrainingRunResult> r =
      RunTraining(Config((*tok)->vocab_size()), o,
                  [&lines](const std::string& line, bool) { lines.push_back(line); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps_run, 2u);
  EXPECT_TRUE(std::isnan(r->initial_validation_loss));
  EXPECT_TRUE(std::isnan(r->final_validation_loss));
  EXPECT_TRUE(std::isfinite(r->final_train_loss));
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("no validation windows")));
  // Text is a corpus: its unigram entropy is the bar the loss should beat.
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("; unigram entropy ")));
}

// Raw token files carry no corpus statistic (the entropy is not computed), so none is printed
// (it used to be "unigram entropy 0.000").
TEST_F(TextTrainingTest, TokenFilesPrintNoUnigramEntropy) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 400; ++i) tokens.push_back(static_cast<uint16_t>(1 + (i * 7) % 40));
  const std::string path = dir_ + "/tokens.u16";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  TrainingRunOptions o = Options();
  o.text_paths.clear();
  o.token_files = {path};
  o.token_format = "u16";
  std::vector<std::string> lines;
  absl::StatusOr<TrainingRunResult> r = RunTraining(
      Config(41), o, [&lines](const std::string& line, bool) { lines.push_back(line); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("400 tokens")));
  EXPECT_THAT(lines, ::testing::Not(::testing::Contains(HasSubstr("unigram entropy"))));
}

// Several devices (docs/scale_out.md): an accumulation the devices cannot split, and CUDA without
// host-task threads (a turn wait would block the other devices' host tasks), are refused.
TEST_F(TextTrainingTest, RefusesDevicesThatCannotSplitTheStep) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = CreateTextTokenizer(model_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int vocab = (*tok)->vocab_size();
  TrainingRunOptions o = Options();
  o.devices = 2;
  o.grad_accumulation = 3;
  absl::StatusOr<TrainingRunResult> odd =
      RunTraining(Config(vocab), o, [](const std::string&, bool) {});
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(odd.status().message(),
              HasSubstr("grad_accumulation=3 must be a multiple of devices=2"));
  o.grad_accumulation = 2;
  o.device.kind = DeviceKind::kCuda;
  o.device.cuda_host_task_threads = false;
  absl::StatusOr<TrainingRunResult> cuda =
      RunTraining(Config(vocab), o, [](const std::string&, bool) {});
  ASSERT_FALSE(cuda.ok());
  EXPECT_THAT(cuda.status().message(), HasSubstr("needs cuda_host_task_threads"));
}

// An arena too small for every activation checkpoint (it failed before device_checkpoints
// chose): the run keeps what fits on the device, the rest in pinned host memory, says so, and
// trains bitwise as with an arena holding them all.
TEST_F(TextTrainingTest, AnArenaShortOfCheckpointsTrainsLikeALargeOne) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = CreateTextTokenizer(model_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ModelConfig config = Config((*tok)->vocab_size());
  config.num_hidden_layers = 9;
  TrainingRunOptions o = Options();
  o.trainer.executor.checkpoint_interval = 1;  // eight checkpoints (none for the top layer)
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<ExecutorGeometry> g =
      MakeExecutorGeometry(config, *layout, o.trainer.micro_batch_size, o.trainer.seq_len,
                           o.trainer.head_chunk, o.trainer.head_block_rows);
  ASSERT_TRUE(g.ok()) << g.status();
  ExecutorOptions all = o.trainer.executor;
  all.device_checkpoints = 8;
  const size_t all_bytes =
      StreamingExecutor::PlanDeviceMemory(g->dims, g->layout, g->entry_elements, all, 2).total();

  absl::StatusOr<TrainingRunResult> large = RunTraining(config, o, [](const std::string&, bool) {});
  ASSERT_TRUE(large.ok()) << large.status();
  o.device.arena_bytes = all_bytes - 1;  // all but the last two fit beside the staging buffer
  std::vector<std::string> lines;
  absl::StatusOr<TrainingRunResult> small =
      RunTraining(config, o, [&lines](const std::string& line, bool) { lines.push_back(line); });
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr(
                         "activation checkpoints: 6 on the device, 2 in pinned host memory")));
  EXPECT_EQ(small->steps_run, large->steps_run);
  EXPECT_EQ(small->final_train_loss, large->final_train_loss);  // bitwise
  EXPECT_EQ(small->final_validation_loss, large->final_validation_loss);
}

TEST_F(TextTrainingTest, RefusesBadJsonlAndSmallVocabularies) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = CreateTextTokenizer(model_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int vocab = (*tok)->vocab_size();
  absl::StatusOr<TrainingRunResult> small =
      RunTraining(Config(vocab - 1), Options(), [](const std::string&, bool) {});
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(small.status().message()), HasSubstr(model_));

  std::ofstream(dir_ + "/corpus.jsonl", std::ios::app) << "{\"text\": [1]}\n";
  absl::StatusOr<TrainingRunResult> bad =
      RunTraining(Config(vocab), Options(), [](const std::string&, bool) {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("corpus.jsonl:37:"));
}

// Starting from a Hugging Face directory: its weights are used (the loss of
// the untrained run differs from a random start) and checkpoints are written
// in the source's dtype unless another is asked for.
TEST_F(TextTrainingTest, StartsFromAHuggingFaceDirectoryAndKeepsItsDtype) {
  const std::string hf_dir = "tests/golden/llama_tiny";
  absl::StatusOr<ModelConfig> config = LoadModelConfig(hf_dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  for (const std::string& dtype : {std::string(""), std::string("BF16")}) {
    TrainingRunOptions o = Options();
    o.init_from_hf_dir = hf_dir;
    o.checkpoint_dtype = dtype;
    o.checkpoint_dir = dir_ + "/hf_checkpoints_" + (dtype.empty() ? "source" : dtype);
    absl::StatusOr<TrainingRunResult> r = RunTraining(*config, o, [](const std::string&, bool) {});
    ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<SafetensorsFile> model =
        SafetensorsFile::Open(r->last_checkpoint + "/model.safetensors");
    ASSERT_TRUE(model.ok()) << model.status();
    const SafetensorsDtype want = dtype.empty() ? SafetensorsDtype::kF32 : SafetensorsDtype::kBF16;
    for (const SafetensorsTensorInfo& t : model->tensors()) EXPECT_EQ(t.dtype, want) << t.name;
  }
  TrainingRunOptions o = Options();
  o.init_from_hf_dir = dir_;  // no weights here
  EXPECT_FALSE(RunTraining(*config, o, [](const std::string&, bool) {}).ok());
}

// Validation evaluates each held-out row once whatever the micro-batch: 3 rows asked for as 8
// micro-batches of 4 or 16 of 2 are the same 3 rows, each counted once (the rows that fill the
// last micro-batch count no target), so the loss of the same weights does not depend on micro.
TEST(ValidationBatchesTest, EachHeldOutRowCountsOnceWhateverTheMicroBatch) {
  std::vector<Sample> samples;
  for (int i = 0; i < 15; ++i) {
    samples.push_back({{1 + i, 2 + i, 3 + i, 4 + i}, {1, 1, 1, 1}});
  }
  SampleBatchOptions o;
  o.seq_len = 3;
  o.pack = false;
  o.validation_fraction = 0.2;  // samples 12, 13, 14: one row each
  absl::StatusOr<SampleBatches> b =
      SampleBatches::Create(std::make_shared<VectorSamples>(samples), o);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->validation_windows(), 3u);
  // The counted targets of every row, by the row's first input.
  auto counted = [](const std::vector<WindowBatch>& batches) {
    std::map<int32_t, int> per_row;
    for (const WindowBatch& w : batches) {
      for (int r = 0; r < w.batch; ++r) {
        for (int t = 0; t < w.seq_len; ++t) {
          if (w.targets[r * w.seq_len + t] >= 0) ++per_row[w.inputs[r * w.seq_len]];
        }
      }
    }
    return per_row;
  };
  absl::StatusOr<std::vector<WindowBatch>> by4 = ValidationBatches(*b, 8, 4);
  absl::StatusOr<std::vector<WindowBatch>> by2 = ValidationBatches(*b, 16, 2);
  ASSERT_TRUE(by4.ok() && by2.ok());
  EXPECT_EQ(by4->size(), 1u);
  EXPECT_EQ(by2->size(), 2u);
  const std::map<int32_t, int> expected = {{13, 3}, {14, 3}, {15, 3}};
  EXPECT_EQ(counted(*by4), expected);
  EXPECT_EQ(counted(*by2), expected);
}

}  // namespace
}  // namespace megatrain::engine
