// Supervised fine-tuning end to end on the CPU device: packed rows (segment-id attention,
// per-sample positions) train exactly like the same samples one per row (losses within fp32
// tolerance at every step), only assistant tokens count unless train_on_prompt, a resumed run
// continues the sample cursor bit for bit, steps or micro-batches with no counted target
// contribute nothing, and eval prompts' greedy replies at every evaluation leave the losses and
// the weights bitwise as they are without them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "engine/data/sample_set_file.h"
#include "engine/device/device_factory.h"
#include "engine/train/training_data.h"
#include "engine/train/training_run.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

constexpr int kVocab = 41;
constexpr int kSampleTokens = 8;  // 4 samples fill a packed row of seq_len 32 (33 slots)
constexpr int kSeqLen = 32;

ModelConfig Config() {
  ModelConfig c = TinyTextModelConfig();
  c.vocab_size = kVocab;
  c.hidden_size = 24;
  c.intermediate_size = 37;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  return c;
}

// Prompt tokens (mask 0) then an answer (mask 1) that repeats a token of the prompt, so there is
// something to learn; `answer_from` is where the answer starts (0 = nothing counts).
std::vector<Sample> MakeSamples(int count, int answer_from) {
  std::vector<Sample> samples;
  uint32_t x = 12345;
  for (int i = 0; i < count; ++i) {
    Sample s;
    for (int t = 0; t < kSampleTokens; ++t) {
      x = x * 1103515245u + 12345u;
      const int32_t token =
          t < 3 ? 1 + static_cast<int32_t>((x >> 16) % (kVocab - 1)) : s.tokens[t % 3];
      s.tokens.push_back(token);
      s.mask.push_back(answer_from > 0 && t >= answer_from ? 1 : 0);
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

class StepLosses : public TrainingObserver {
 public:
  void OnStep(const StepReport& report, double) override { reports.push_back(report); }
  bool ShouldStop() override { return stop_after > 0 && reports.size() >= stop_after; }
  bool CheckpointBeforeStop() override { return true; }
  std::vector<StepReport> reports;
  size_t stop_after = 0;
};

class SftTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    samples_ = dir_ + "/sft.mtsft";
    ASSERT_TRUE(WriteSampleSetFile(samples_, MakeSamples(48, 3)).ok());
  }

  // Packed: 2 rows of 4 samples per step; unpacked: 8 rows of one sample. Same 8 samples.
  TrainingRunOptions Options(bool pack) const {
    TrainingRunOptions o;
    o.sft_sample_paths = {samples_};
    o.pack = pack;
    o.trainer.micro_batch_size = pack ? 2 : 8;
    o.trainer.seq_len = kSeqLen;
    o.trainer.collect_timeline = false;
    o.trainer.lr.peak_lr = 3e-3;
    o.trainer.lr.warmup_steps = 0;
    o.trainer.lr.total_steps = 6;
    o.steps = 6;
    o.eval_every = 0;
    o.eval_batches = 1;
    o.validation_fraction = 0;
    o.seed = 5;
    o.device.arena_bytes = 64 << 20;
    o.device.pinned_budget_bytes = 256 << 20;
    return o;
  }

  std::vector<StepReport> Run(const TrainingRunOptions& o,
                              std::vector<std::string>* lines = nullptr) {
    StepLosses observer;
    class Lines : public StepLosses {
     public:
      std::vector<std::string>* out = nullptr;
      void OnLine(const std::string& line, bool) override {
        if (out != nullptr) out->push_back(line);
      }
    } with_lines;
    with_lines.out = lines;
    absl::StatusOr<TrainingRunResult> r = RunTraining(Config(), o, with_lines);
    EXPECT_TRUE(r.ok()) << r.status();
    return with_lines.reports;
  }

  std::string dir_;
  std::string samples_;
};

// The key property: packing changes where samples sit, never what they compute. Loss and
// gradients are sums over the same counted targets; only the attention tiles and the GEMM
// shapes round differently, so the losses agree to ~1e-6 relative after 6 updates.
TEST_F(SftTrainingTest, PackedAndUnpackedRunsGiveTheSameLosses) {
  std::vector<std::string> lines;
  const std::vector<StepReport> packed = Run(Options(true), &lines);
  const std::vector<StepReport> unpacked = Run(Options(false));
  ASSERT_EQ(packed.size(), 6u);
  ASSERT_EQ(unpacked.size(), 6u);
  for (size_t i = 0; i < packed.size(); ++i) {
    // 8 samples x 5 counted targets (mask 1 on tokens 3..7).
    EXPECT_EQ(packed[i].valid_tokens, 40) << "step " << i + 1;
    EXPECT_EQ(unpacked[i].valid_tokens, 40) << "step " << i + 1;
    EXPECT_NEAR(packed[i].loss, unpacked[i].loss, 2e-5 * std::abs(unpacked[i].loss))
        << "step " << i + 1;
    EXPECT_NEAR(packed[i].grad_norm, unpacked[i].grad_norm, 1e-4 * unpacked[i].grad_norm)
        << "step " << i + 1;
    std::printf("step %zu: packed loss %.9g unpacked %.9g (rel %.2g)\n", i + 1, packed[i].loss,
                unpacked[i].loss, std::abs(packed[i].loss / unpacked[i].loss - 1));
  }
  EXPECT_LT(packed.back().loss, packed.front().loss);  // it learns
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("48 train / 0 validation samples")));
  // A corpus statistic has no meaning for samples whose loss counts only masked targets.
  EXPECT_THAT(lines, ::testing::Not(::testing::Contains(HasSubstr("unigram entropy"))));
}

TEST_F(SftTrainingTest, OnlyAssistantTokensCountUnlessTrainOnPrompt) {
  TrainingRunOptions o = Options(true);
  const std::vector<StepReport> assistant = Run(o);
  o.train_on_prompt = true;
  const std::vector<StepReport> all = Run(o);
  ASSERT_EQ(assistant.size(), all.size());
  EXPECT_EQ(all[0].valid_tokens, 8 * (kSampleTokens - 1));  // every token but each first
  EXPECT_EQ(assistant[0].valid_tokens, 8 * 5);
  // Other terms in the mean from the first step on, so other losses (and weights) at every step.
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_GT(std::abs(all[i].loss - assistant[i].loss), 1e-4)
        << "step " << i + 1 << ": " << all[i].loss << " vs " << assistant[i].loss;
  }
  // The job's identity names the options, so a resume with other ones is refused.
  EXPECT_THAT(TrainingJobJson(o), HasSubstr("\"train_on_prompt\":true"));
  EXPECT_THAT(TrainingJobJson(o), HasSubstr("sft.mtsft"));
}

TEST_F(SftTrainingTest, ResumedRunContinuesTheSampleCursorBitwise) {
  TrainingRunOptions o = Options(true);
  o.checkpoint_dir = dir_ + "/straight";
  const std::vector<StepReport> straight = Run(o);
  o.checkpoint_dir = dir_ + "/resumed";
  StepLosses first;
  first.stop_after = 3;
  EXPECT_EQ(RunTraining(Config(), o, first).status().code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(first.reports.size(), 3u);
  o.resume = true;
  const std::vector<StepReport> rest = Run(o);
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.reports[i].loss, straight[i].loss) << "step " << i + 1;
    EXPECT_EQ(rest[i].loss, straight[i + 3].loss) << "step " << i + 4;  // bitwise
    EXPECT_EQ(rest[i].grad_norm, straight[i + 3].grad_norm) << "step " << i + 4;
  }
}

// Eval prompts (three, so the second forward group of two rows has a spare one) at the start, at
// every 2nd step and at the last: the replies come in prompt order after each evaluation, each at
// most eval_reply_tokens long and cut at a stop id; the losses, the validation losses and the
// checkpoint's weights are those of the run without them, bit for bit.
TEST_F(SftTrainingTest, EvalPromptRepliesLeaveTrainingBitwiseUnchanged) {
  class Recorder : public StepLosses {
   public:
    void OnStep(const StepReport& report, double validation_loss) override {
      StepLosses::OnStep(report, validation_loss);
      validation.push_back(validation_loss);
    }
    void OnEvalReplies(uint64_t step, std::vector<EvalReplyReport>& replies) override {
      rounds.emplace_back(step, replies);
    }
    std::vector<double> validation;
    std::vector<std::pair<uint64_t, std::vector<EvalReplyReport>>> rounds;
  };
  auto run = [&](bool with_prompts, const std::string& checkpoints, Recorder& recorder) {
    TrainingRunOptions o = Options(true);
    o.validation_fraction = 0.25;
    o.eval_every = 2;
    o.eval_batches = 2;
    o.steps = 5;
    o.checkpoint_dir = dir_ + "/" + checkpoints;
    if (with_prompts) {
      o.eval_prompts = {{"first", {1, 2, 3}}, {"second", {7, 7}}, {"third", {9, 8, 7, 6}}};
      o.eval_stop_ids = {4, 11};
      o.eval_reply_tokens = 5;
      o.eval_vocab_limit = kVocab - 1;
    }
    absl::StatusOr<TrainingRunResult> r = RunTraining(Config(), o, recorder);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->last_checkpoint : std::string();
  };
  Recorder plain, prompted;
  const std::string plain_checkpoint = run(false, "plain", plain);
  const std::string prompted_checkpoint = run(true, "prompted", prompted);
  ASSERT_EQ(plain.reports.size(), 5u);
  ASSERT_EQ(prompted.reports.size(), 5u);
  for (size_t i = 0; i < plain.reports.size(); ++i) {
    EXPECT_EQ(prompted.reports[i].loss, plain.reports[i].loss) << "step " << i + 1;
    EXPECT_EQ(prompted.reports[i].grad_norm, plain.reports[i].grad_norm) << "step " << i + 1;
    EXPECT_EQ(prompted.validation[i], plain.validation[i]) << "step " << i + 1;
  }
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  };
  ASSERT_FALSE(plain_checkpoint.empty());
  ASSERT_FALSE(prompted_checkpoint.empty());
  const std::string weights = bytes(plain_checkpoint + "/model.safetensors");
  EXPECT_GT(weights.size(), 1000u);
  EXPECT_TRUE(weights == bytes(prompted_checkpoint + "/model.safetensors"));

  EXPECT_TRUE(plain.rounds.empty());
  ASSERT_EQ(prompted.rounds.size(), 4u);  // before step 1, after steps 2, 4 and 5
  const std::vector<uint64_t> steps = {0, 2, 4, 5};
  for (size_t k = 0; k < prompted.rounds.size(); ++k) {
    const auto& [step, replies] = prompted.rounds[k];
    EXPECT_EQ(step, steps[k]);
    ASSERT_EQ(replies.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const EvalReplyReport& r = replies[static_cast<size_t>(i)];
      EXPECT_EQ(r.index, i);
      EXPECT_EQ(r.prompt, std::vector<std::string>({"first", "second", "third"})[i]);
      ASSERT_FALSE(r.ids.empty());
      EXPECT_LE(r.ids.size(), 5u);
      for (size_t t = 0; t < r.ids.size(); ++t) {
        EXPECT_LT(r.ids[t], kVocab - 1);
        const bool is_stop = r.ids[t] == 4 || r.ids[t] == 11;
        EXPECT_EQ(is_stop, r.stopped && t + 1 == r.ids.size()) << "round " << k << " reply " << i;
      }
      EXPECT_TRUE(r.stopped || r.ids.size() == 5u);
      EXPECT_TRUE(r.text.empty());
    }
  }
}

// A stop (a pause, a cancel) asked for in the middle of an eval round is noticed before the
// round's next forward: the observer asks for it at its 3rd poll after step 1 (the poll before
// step 2, then the first two forwards of the round after step 2). The round ends unreported and
// the run stops before step 3 with step 2 kept. Counted in polls, never in time.
TEST_F(SftTrainingTest, AStopDuringAnEvalRoundEndsTheRoundBeforeItsNextToken) {
  class StopMidRound : public StepLosses {
   public:
    bool ShouldStop() override {
      if (reports.size() == 1 && !stop) stop = ++polls_after_step_1 == 3;
      return stop;
    }
    void OnLine(const std::string& line, bool) override { lines.push_back(line); }
    void OnEvalReplies(uint64_t step, std::vector<EvalReplyReport>&) override {
      rounds.push_back(step);
    }
    bool stop = false;
    int polls_after_step_1 = 0;
    std::vector<uint64_t> rounds;
    std::vector<std::string> lines;
  } observer;
  TrainingRunOptions o = Options(true);
  o.eval_every = 2;
  o.steps = 5;
  o.checkpoint_dir = dir_ + "/stop_mid_round";
  // No stop ids: each reply runs its 5 tokens, so the round has 2 groups x 5 forwards to cut.
  o.eval_prompts = {{"first", {1, 2, 3}}, {"second", {7, 7}}, {"third", {9, 8, 7, 6}}};
  o.eval_reply_tokens = 5;
  o.eval_vocab_limit = kVocab - 1;
  absl::StatusOr<TrainingRunResult> r = RunTraining(Config(), o, observer);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("stopped before step 3"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("checkpoint written"));
  EXPECT_EQ(observer.polls_after_step_1, 3);
  EXPECT_EQ(observer.rounds, std::vector<uint64_t>({0}));  // the round after step 2 unreported
  EXPECT_EQ(observer.reports.size(), 2u);
  EXPECT_THAT(
      observer.lines,
      ::testing::Contains(HasSubstr("the round after step 2 ended early: a stop was requested")));
}

TEST_F(SftTrainingTest, OverlongSamplesAreRefusedOrTruncatedAndReported) {
  std::vector<Sample> samples = MakeSamples(8, 3);
  Sample& long_one = samples[5];
  for (int i = 0; i < 40; ++i) {
    long_one.tokens.push_back(1 + i % 7);
    long_one.mask.push_back(1);
  }
  const std::string path = dir_ + "/long.mtsft";
  ASSERT_TRUE(WriteSampleSetFile(path, samples).ok());
  TrainingRunOptions o = Options(true);
  o.sft_sample_paths = {path};
  o.steps = 1;
  std::vector<std::string> lines;
  ASSERT_EQ(Run(o, &lines).size(), 1u);
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("1 truncated to seq_len+1")));
  o.overlong = "refuse";
  absl::StatusOr<TrainingRunResult> refused =
      RunTraining(Config(), o, [](const std::string&, bool) {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("sample 5 has 48 tokens"));
  o.overlong = "drop";
  EXPECT_FALSE(RunTraining(Config(), o, [](const std::string&, bool) {}).ok());
  // A vocabulary smaller than the file's V is refused before training.
  ModelConfig small = Config();
  small.vocab_size = 10;
  o.overlong = "truncate";
  EXPECT_THAT(
      std::string(RunTraining(small, o, [](const std::string&, bool) {}).status().message()),
      HasSubstr("outside vocab_size=10"));
}

// A step where nothing counts updates nothing and reports loss 0 (no NaN); a micro-batch with no
// counted target beside others contributes exactly zero: the step equals the one without it.
TEST_F(SftTrainingTest, NoCountedTargetsGiveZeroContributionWithoutNaN) {
  const std::string nothing = dir_ + "/nothing.mtsft";
  ASSERT_TRUE(WriteSampleSetFile(nothing, MakeSamples(16, 0)).ok());
  TrainingRunOptions o = Options(true);
  o.sft_sample_paths = {nothing};
  o.steps = 2;
  const std::vector<StepReport> empty = Run(o);
  ASSERT_EQ(empty.size(), 2u);
  for (const StepReport& r : empty) {
    EXPECT_TRUE(r.no_counted_targets);
    EXPECT_EQ(r.loss, 0.0);
    EXPECT_EQ(r.valid_tokens, 0);
    EXPECT_FALSE(r.skipped);
  }
  // Held-out samples with nothing counted: the validation loss is NaN, not a failed run.
  o.validation_fraction = 0.25;
  o.eval_every = 1;
  absl::StatusOr<TrainingRunResult> held_out =
      RunTraining(Config(), o, [](const std::string&, bool) {});
  ASSERT_TRUE(held_out.ok()) << held_out.status();
  EXPECT_TRUE(std::isnan(held_out->final_validation_loss));

  // Trainer level: [empty row batch, batch B] vs [B] alone.
  DeviceOptions device_options;
  device_options.arena_bytes = 64 << 20;
  device_options.pinned_budget_bytes = 256 << 20;
  TrainerOptions t;
  t.micro_batch_size = 1;
  t.seq_len = kSeqLen;
  t.collect_timeline = false;
  t.executor.segment_ids = true;
  auto sft = [&](const std::string& path) {
    TrainingRunOptions r = Options(true);
    r.sft_sample_paths = {path};
    r.trainer = t;
    absl::StatusOr<TrainingData> data = PrepareTrainingData(Config(), r);
    EXPECT_TRUE(data.ok()) << data.status();
    return *data->batches->NextTrainBatch(1);
  };
  const WindowBatch zero = sft(nothing);
  const WindowBatch counted = sft(samples_);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (bool with_empty : {true, false}) {
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(device_options);
    ASSERT_TRUE(device.ok());
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(**device, Config(), t);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    std::vector<const int32_t*> in, tg;
    std::vector<TokenLayout> layouts;
    for (const WindowBatch* b : {&zero, &counted}) {
      if (b == &zero && !with_empty) continue;
      in.push_back(b->inputs.data());
      tg.push_back(b->targets.data());
      layouts.push_back(LayoutOf(*b));
    }
    absl::StatusOr<StepReport> report = (*trainer)->Step(in, tg, layouts);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(std::isfinite(report->loss));
    losses.push_back(report->loss);
    absl::StatusOr<std::vector<float>> g =
        (*trainer)->ReadGradient("model.layers.0.self_attn.q_proj.weight");
    ASSERT_TRUE(g.ok()) << g.status();
    grads.push_back(*g);
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);

  // Layouts are checked before anything is copied: positions within [0, seq), segment ids
  // non-decreasing along each sequence.
  {
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(device_options);
    ASSERT_TRUE(device.ok());
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(**device, Config(), t);
    ASSERT_TRUE(trainer.ok());
    (*trainer)->InitializeRandom(3);
    std::vector<int32_t> positions = counted.positions;
    positions[5] = kSeqLen;
    absl::StatusOr<StepReport> bad =
        (*trainer)->Step({counted.inputs.data()}, {counted.targets.data()},
                         {TokenLayout{positions.data(), counted.segments.data()}});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("position 32 of token 5"));
    std::vector<int32_t> segments = counted.segments;
    segments[9] = -1;
    bad = (*trainer)->Step({counted.inputs.data()}, {counted.targets.data()},
                           {TokenLayout{counted.positions.data(), segments.data()}});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("segment id -1 of token 9"));
  }

  // An executor not created for segment ids refuses a micro-batch that carries them (it would
  // otherwise attend across samples silently).
  t.executor.segment_ids = false;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(device_options);
  ASSERT_TRUE(device.ok());
  absl::StatusOr<std::unique_ptr<Trainer>> plain = Trainer::Create(**device, Config(), t);
  ASSERT_TRUE(plain.ok());
  (*plain)->InitializeRandom(3);
  absl::StatusOr<StepReport> refused =
      (*plain)->Step({counted.inputs.data()}, {counted.targets.data()}, {LayoutOf(counted)});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("segment_ids"));
}

}  // namespace
}  // namespace megatrain::engine
