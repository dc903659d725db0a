// Sample-set files (header checks naming file and field, truncation as DATA_LOSS, round trip)
// and SampleBatches (packed and unpacked rows, masks, positions, segments, overlong samples,
// the split and a resumed cursor).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "engine/data/sample_batches.h"
#include "engine/data/sample_set_file.h"

namespace megatrain::engine {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string WriteBytes(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return path;
}

Sample MakeSample(std::vector<int32_t> tokens, std::vector<uint8_t> mask) {
  return Sample{std::move(tokens), std::move(mask)};
}

std::vector<Sample> ThreeSamples() {
  return {MakeSample({1, 2, 3, 4}, {0, 0, 1, 1}), MakeSample({5, 6, 7}, {0, 1, 1}),
          MakeSample({8, 9, 10, 11, 12}, {0, 0, 0, 1, 1})};
}

TEST(SampleSetFileTest, RoundTripsSamplesAndHeader) {
  const std::string path = TempPath("three.mtsft");
  ASSERT_TRUE(WriteSampleSetFile(path, ThreeSamples()).ok());
  absl::StatusOr<SampleSetFile> f = SampleSetFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->samples(), 3u);
  EXPECT_EQ(f->tokens(), 12u);
  EXPECT_EQ(f->vocab_bound(), 13u);
  EXPECT_EQ(f->SampleLength(2), 5u);
  Sample s;
  ASSERT_TRUE(f->ReadSample(2, 5, &s).ok());
  EXPECT_EQ(s.tokens, std::vector<int32_t>({8, 9, 10, 11, 12}));
  EXPECT_EQ(s.mask, std::vector<uint8_t>({0, 0, 0, 1, 1}));
  ASSERT_TRUE(f->ReadSample(0, 2, &s).ok());  // a prefix (truncation)
  EXPECT_EQ(s.tokens, std::vector<int32_t>({1, 2}));
  // The exact bytes of the fixed format.
  absl::StatusOr<std::string> bytes = EncodeSampleSet(ThreeSamples());
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 32u + 4 * 8 + 12 * 4 + 12);
  EXPECT_EQ(std::memcmp(bytes->data(), "MTSFT\0\0\x01", 8), 0);
}

TEST(SampleSetFileTest, SeveralFilesReadAsOneSet) {
  const std::string a = TempPath("a.mtsft"), b = TempPath("b.mtsft"), e = TempPath("e.mtsft");
  ASSERT_TRUE(WriteSampleSetFile(a, {ThreeSamples()[0]}).ok());
  ASSERT_TRUE(WriteSampleSetFile(e, {}).ok());
  ASSERT_TRUE(WriteSampleSetFile(b, {ThreeSamples()[1], ThreeSamples()[2]}).ok());
  absl::StatusOr<SampleSetFiles> files = SampleSetFiles::Open({a, e, b});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->samples(), 3u);
  EXPECT_EQ(files->vocab_bound(), 13u);
  Sample s;
  ASSERT_TRUE(files->ReadSample(1, 3, &s).ok());
  EXPECT_EQ(s.tokens, std::vector<int32_t>({5, 6, 7}));
}

// Each corrupted header field is refused with the file and the field named.
TEST(SampleSetFileTest, RefusesBadHeaderFieldsNamingThem) {
  const std::string good = *EncodeSampleSet(ThreeSamples());
  struct Case {
    const char* name;
    size_t offset;
    uint64_t value;
    int width;
    const char* expect;
  };
  const Case cases[] = {
      {"magic", 7, 2, 1, "magic"},
      {"n", 8, 4, 8, "N = 4"},
      {"n_huge", 8, uint64_t{1} << 60, 8, "N"},
      {"t", 16, 13, 8, "N = 3 and T = 13"},
      {"v_zero", 24, 0, 4, "V"},
      {"reserved", 28, 7, 4, "reserved"},
      {"o0", 32, 1, 8, "o[0]"},
      {"o2", 48, 2, 8, "o[2]"},
      {"o3", 56, 11, 8, "o[N]"},
  };
  for (const Case& c : cases) {
    std::string bytes = good;
    std::memcpy(bytes.data() + c.offset, &c.value, c.width);
    const std::string path = WriteBytes(std::string("bad_") + c.name + ".mtsft", bytes);
    absl::StatusOr<SampleSetFile> f = SampleSetFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << f.status();
  }
  // Extra bytes after the mask are refused too.
  const std::string longer = WriteBytes("longer.mtsft", good + "x");
  EXPECT_EQ(SampleSetFile::Open(longer).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SampleSetFileTest, TruncatedFilesAreDataLossNamingFileAndOffset) {
  const std::string good = *EncodeSampleSet(ThreeSamples());
  for (size_t keep : {size_t{0}, size_t{20}, size_t{40}, good.size() - 1}) {
    const std::string path = WriteBytes("cut.mtsft", good.substr(0, keep));
    absl::StatusOr<SampleSetFile> f = SampleSetFile::Open(path);
    ASSERT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << keep << " " << f.status();
    EXPECT_NE(f.status().message().find(path), std::string::npos);
    EXPECT_NE(f.status().message().find(absl::StrCat("offset ", keep)), std::string::npos)
        << f.status();
  }
  // Cut under the run, after Open checked it: the read that meets the cut fails.
  const std::string path = WriteBytes("cut_later.mtsft", good);
  absl::StatusOr<SampleSetFile> f = SampleSetFile::Open(path);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(path.c_str(), 70), 0);
  Sample s;
  const absl::Status read = f->ReadSample(2, 5, &s);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_NE(read.message().find(path), std::string::npos);
}

TEST(SampleSetFileTest, RefusesBadBodiesAndNonRegularFiles) {
  std::string bytes = *EncodeSampleSet(ThreeSamples());
  const size_t tokens_at = 32 + 4 * 8;
  std::string big_token = bytes;
  const uint32_t huge = 13;  // == V
  std::memcpy(big_token.data() + tokens_at + 4 * 5, &huge, 4);
  absl::StatusOr<SampleSetFile> f = SampleSetFile::Open(WriteBytes("big.mtsft", big_token));
  ASSERT_TRUE(f.ok());
  Sample s;
  absl::Status read = f->ReadSample(1, 3, &s);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.message().find("sample 1 token 1"), std::string::npos) << read;
  std::string bad_mask = bytes;
  bad_mask[tokens_at + 12 * 4 + 2] = 2;
  f = SampleSetFile::Open(WriteBytes("mask.mtsft", bad_mask));
  ASSERT_TRUE(f.ok());
  read = f->ReadSample(0, 4, &s);
  EXPECT_NE(read.message().find("mask byte 2"), std::string::npos) << read;
  const std::string fifo = TempPath("fifo.mtsft");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(SampleSetFile::Open(fifo).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleSetFile::Open(TempPath("missing.mtsft")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(EncodeSampleSet({MakeSample({1, 2}, {1})}).ok());
}

std::shared_ptr<const SampleSource> InMemory(std::vector<Sample> samples) {
  return std::make_shared<VectorSamples>(std::move(samples));
}

// seq_len 8: a row is a 9-slot window. Samples of 4 and 3 tokens pack into one row (7 slots);
// the 5-token sample starts the next.
TEST(SampleBatchesTest, PacksWholeSamplesWithMasksPositionsAndSegments) {
  SampleBatchOptions o;
  o.seq_len = 8;
  o.seed = 3;
  absl::StatusOr<SampleBatches> b = SampleBatches::Create(InMemory(ThreeSamples()), o);
  ASSERT_TRUE(b.ok()) << b.status();
  // Read the epoch order back through unpacked rows of the same seed.
  SampleBatchOptions single = o;
  single.pack = false;
  absl::StatusOr<SampleBatches> one = SampleBatches::Create(InMemory(ThreeSamples()), single);
  ASSERT_TRUE(one.ok());
  absl::StatusOr<WindowBatch> rows = one->NextTrainBatch(3);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(one->cursor(), 3u);
  // Unpacked: each row one sample from position 0, padding after it in segment 1.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(rows->positions[r * 8], 0);
    EXPECT_EQ(rows->segments[r * 8], 0);
    EXPECT_EQ(rows->segments[r * 8 + 7], 1);
    EXPECT_EQ(rows->targets[r * 8 + 7], -1);
  }
  // Find the row holding sample {1,2,3,4}: targets count where the mask of the NEXT token is 1.
  for (int r = 0; r < 3; ++r) {
    if (rows->inputs[r * 8] != 1) continue;
    const std::vector<int32_t> in(rows->inputs.begin() + r * 8, rows->inputs.begin() + r * 8 + 8);
    const std::vector<int32_t> tg(rows->targets.begin() + r * 8, rows->targets.begin() + r * 8 + 8);
    const std::vector<int32_t> pos(rows->positions.begin() + r * 8,
                                   rows->positions.begin() + r * 8 + 8);
    EXPECT_EQ(in, std::vector<int32_t>({1, 2, 3, 4, 0, 0, 0, 0}));
    EXPECT_EQ(tg, std::vector<int32_t>({-1, 3, 4, -1, -1, -1, -1, -1}));
    EXPECT_EQ(pos, std::vector<int32_t>({0, 1, 2, 3, 0, 1, 2, 3}));
  }
  // Packed, the same order: check a row's structure directly.
  absl::StatusOr<WindowBatch> packed = b->NextTrainBatch(1);
  ASSERT_TRUE(packed.ok());
  int segments_seen = packed->segments[7] + 1;
  EXPECT_GE(segments_seen, 2);  // at least one sample and padding, or two samples
  for (int i = 1; i < 8; ++i) {
    EXPECT_GE(packed->segments[i], packed->segments[i - 1]);
    if (packed->segments[i] != packed->segments[i - 1]) {
      EXPECT_EQ(packed->positions[i], 0);
      EXPECT_EQ(packed->targets[i - 1], -1) << "a target crossed a sample boundary at " << i;
    } else {
      EXPECT_EQ(packed->positions[i], packed->positions[i - 1] + 1);
    }
  }
}

TEST(SampleBatchesTest, ExactPackedRowForAKnownOrder) {
  // One training sample order is forced by having the samples identical in length.
  std::vector<Sample> samples = {MakeSample({1, 2, 3}, {0, 1, 1}), MakeSample({4, 5, 6}, {0, 0, 1}),
                                 MakeSample({7, 8, 9}, {0, 1, 0})};
  SampleBatchOptions o;
  o.seq_len = 7;  // 8 slots: two 3-token samples (6 slots), the third does not fit; 1 padding
  absl::StatusOr<SampleBatches> b = SampleBatches::Create(InMemory(samples), o);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<WindowBatch> row = b->NextTrainBatch(1);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(b->cursor(), 2u);
  const int first = row->inputs[0];
  const int second = row->inputs[3];
  ASSERT_NE(first, second);
  EXPECT_EQ(row->positions, std::vector<int32_t>({0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(row->segments, std::vector<int32_t>({0, 0, 0, 1, 1, 1, 2}));
  EXPECT_EQ(row->inputs[6], 0);
  EXPECT_EQ(row->targets[2], -1);  // last token of sample 0: the next is another sample
  EXPECT_EQ(row->targets[5], -1);
  EXPECT_EQ(row->targets[6], -1);
  // train_on_prompt counts every next token within the sample.
  o.train_on_prompt = true;
  absl::StatusOr<SampleBatches> all = SampleBatches::Create(InMemory(samples), o);
  absl::StatusOr<WindowBatch> all_row = all->NextTrainBatch(1);
  ASSERT_TRUE(all_row.ok());
  EXPECT_EQ(all_row->targets[0], first + 1);
  EXPECT_EQ(all_row->targets[1], first + 2);
  EXPECT_EQ(all_row->targets[3], second + 1);
  EXPECT_EQ(all_row->targets[4], second + 2);
  EXPECT_EQ(all_row->targets[2], -1);
}

TEST(SampleBatchesTest, OverlongSamplesAreTruncatedOrRefusedAndCounted) {
  std::vector<Sample> samples = {MakeSample({1, 2, 3, 4, 5, 6, 7}, {0, 1, 1, 1, 1, 1, 1}),
                                 MakeSample({1}, {0}), MakeSample({3, 4}, {0, 1})};
  SampleBatchOptions o;
  o.seq_len = 4;
  absl::StatusOr<SampleBatches> b = SampleBatches::Create(InMemory(samples), o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->truncated_samples(), 1u);
  EXPECT_EQ(b->truncated_without_targets(), 0u);  // its kept tokens hold 4 assistant targets
  EXPECT_EQ(b->dropped_samples(), 1u);
  EXPECT_EQ(b->train_samples(), 2u);
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<WindowBatch> row = b->NextTrainBatch(1);
    ASSERT_TRUE(row.ok());
    if (row->inputs[0] == 1) {  // the truncated sample fills the whole 5-slot window
      EXPECT_EQ(row->inputs, std::vector<int32_t>({1, 2, 3, 4}));
      EXPECT_EQ(row->targets, std::vector<int32_t>({2, 3, 4, 5}));
    }
  }
  // A long prompt before a short reply: the 5 tokens kept are all prompt, so it trains nothing,
  // and it is counted apart (not with train_on_prompt, where every kept token counts).
  std::vector<Sample> long_prompt = samples;
  long_prompt.push_back(MakeSample({1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 0, 0, 1, 1}));
  absl::StatusOr<SampleBatches> prompts = SampleBatches::Create(InMemory(long_prompt), o);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  EXPECT_EQ(prompts->truncated_samples(), 2u);
  EXPECT_EQ(prompts->truncated_without_targets(), 1u);
  SampleBatchOptions on_prompt = o;
  on_prompt.train_on_prompt = true;
  absl::StatusOr<SampleBatches> all = SampleBatches::Create(InMemory(long_prompt), on_prompt);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->truncated_without_targets(), 0u);
  o.overlong = OverlongPolicy::kRefuse;
  absl::StatusOr<SampleBatches> refused = SampleBatches::Create(InMemory(samples), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("sample 0 has 7 tokens"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(ParseOverlongPolicy("drop").ok());
}

TEST(SampleBatchesTest, SplitsBySampleAndResumesFromTheCursorBitwise) {
  std::vector<Sample> samples;
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> t;
    std::vector<uint8_t> m;
    for (int j = 0; j < 2 + i % 5; ++j) {
      t.push_back(i * 7 + j);
      m.push_back(j % 2);
    }
    samples.push_back(MakeSample(t, m));
  }
  SampleBatchOptions o;
  o.seq_len = 9;
  o.validation_fraction = 0.1;
  o.seed = 11;
  absl::StatusOr<SampleBatches> straight = SampleBatches::Create(InMemory(samples), o);
  ASSERT_TRUE(straight.ok());
  EXPECT_EQ(straight->train_samples(), 36u);
  EXPECT_EQ(straight->validation_samples(), 4u);
  ASSERT_GT(straight->validation_windows(), 0u);
  std::vector<WindowBatch> first;
  for (int i = 0; i < 30; ++i) first.push_back(*straight->NextTrainBatch(2));  // several epochs
  absl::StatusOr<SampleBatches> resumed = SampleBatches::Create(InMemory(samples), o);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(resumed->NextTrainBatch(2).ok());
  const uint64_t cursor = resumed->cursor();
  absl::StatusOr<SampleBatches> fresh = SampleBatches::Create(InMemory(samples), o);
  fresh->set_cursor(cursor);
  for (int i = 10; i < 30; ++i) {
    absl::StatusOr<WindowBatch> got = fresh->NextTrainBatch(2);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->inputs, first[i].inputs) << i;
    EXPECT_EQ(got->targets, first[i].targets) << i;
    EXPECT_EQ(got->positions, first[i].positions) << i;
    EXPECT_EQ(got->segments, first[i].segments) << i;
  }
  // Validation rows hold only held-out samples (ids >= 36 * 7).
  absl::StatusOr<WindowBatch> v = straight->ValidationBatch(0, 1);
  ASSERT_TRUE(v.ok());
  EXPECT_GE(v->inputs[0], 36 * 7);
}

}  // namespace
}  // namespace megatrain::engine
