// Tests for safetensors dtype conversion, the writer, the strict reader and the malformed corpus.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/safetensors_corpus.h"
#include "engine/model/safetensors_dtype.h"
#include "engine/model/safetensors_reader.h"
#include "engine/model/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp16.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

template <typename T>
absl::Span<const uint8_t> AsBytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

TEST(Bf16Test, RoundToNearestEvenOnTrickyValues) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80},                        // 1
      {0x3f808000, 0x3f80},                        // tie, even stays
      {0x3f818000, 0x3f82},                        // tie, odd rounds up
      {0x3f808001, 0x3f81},                        // just above the tie
      {0x3f807fff, 0x3f80},                        // just below the tie
      {0x80000000, 0x8000},                        // -0
      {0x00000001, 0x0000},                        // smallest subnormal rounds to 0
      {0x00018000, 0x0002},                        // subnormal tie, odd rounds up
      {0x7f7fffff, 0x7f80},                        // FLT_MAX rounds to inf
      {0xff7fffff, 0xff80}, {0x7f7f7fff, 0x7f7f},  // largest value that stays finite
      {0x7f800000, 0x7f80},                        // inf
      {0xff800000, 0xff80},                        // -inf
      {0x7fc00000, 0x7fc0},                        // quiet NaN
  };
  for (const Case& c : cases) {
    EXPECT_EQ(kernels::Float32ToBf16Bits(F(c.in)), c.out) << std::hex << c.in;
  }
  // Signalling NaNs whose payload sits in the dropped bits must not become inf.
  for (uint32_t nan : {0x7f800001u, 0xff800001u, 0x7f80ffffu}) {
    const uint16_t b = kernels::Float32ToBf16Bits(F(nan));
    EXPECT_TRUE(std::isnan(kernels::Bf16BitsToFloat32(b))) << std::hex << nan;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000);
  }
}

TEST(Bf16Test, EveryBf16ValueWidensExactlyAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = kernels::Bf16BitsToFloat32(static_cast<uint16_t>(b));
    ASSERT_EQ(Bits(f), b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(kernels::Float32ToBf16Bits(f), b) << std::hex << b;
    }
  }
}

TEST(Fp16Test, EveryHalfValueWidensExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float ours = kernels::Float16BitsToFloat32(static_cast<uint16_t>(h));
    const float oracle = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    if (std::isnan(oracle)) {
      ASSERT_TRUE(std::isnan(ours)) << std::hex << h;
      ASSERT_EQ(Bits(ours) & 0x80000000u, Bits(oracle) & 0x80000000u);
      continue;
    }
    ASSERT_EQ(Bits(ours), Bits(oracle)) << std::hex << h;
    ASSERT_EQ(kernels::Float32ToFloat16Bits(ours), h) << std::hex << h;
  }
}

TEST(Fp16Test, NarrowingMatchesTheCompilerAcrossFloat32) {
  // A stride through all float bit patterns plus the boundaries of every
  // binary16 rounding region (ties, subnormal edges, overflow).
  std::vector<uint32_t> inputs;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 65521) inputs.push_back(static_cast<uint32_t>(b));
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const uint32_t f = Bits(kernels::Float16BitsToFloat32(static_cast<uint16_t>(h)));
    for (int32_t d : {-2, -1, 0, 1, 2}) inputs.push_back(static_cast<uint32_t>(f + d));
    const float next = kernels::Float16BitsToFloat32(static_cast<uint16_t>(h + 1));
    const float mid = (kernels::Float16BitsToFloat32(static_cast<uint16_t>(h)) + next) / 2;
    for (int32_t d : {-1, 0, 1}) inputs.push_back(static_cast<uint32_t>(Bits(mid) + d));
  }
  inputs.push_back(0x477ff000);  // 65520: ties to inf
  inputs.push_back(0x477fefff);  // just below: 65504
  inputs.push_back(0x33000000);  // 2^-25: ties to 0
  inputs.push_back(0x33000001);  // just above: smallest subnormal
  for (uint32_t in : inputs) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = F(in ^ sign);
      if (std::isnan(x)) continue;
      const uint16_t oracle = std::bit_cast<uint16_t>(static_cast<_Float16>(x));
      ASSERT_EQ(kernels::Float32ToFloat16Bits(x), oracle) << std::hex << Bits(x);
    }
  }
  const uint16_t nan = kernels::Float32ToFloat16Bits(F(0x7f800001));
  EXPECT_TRUE(std::isnan(kernels::Float16BitsToFloat32(nan)));
}

TEST(DtypeTest, NamesSizesAndConversionErrors) {
  EXPECT_EQ(ParseSafetensorsDtype("BF16"), SafetensorsDtype::kBF16);
  EXPECT_EQ(ParseSafetensorsDtype("BOOL"), SafetensorsDtype::kBool);
  EXPECT_FALSE(ParseSafetensorsDtype("F8_E4M3").has_value());
  EXPECT_FALSE(ParseSafetensorsDtype("f32").has_value());
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kF64), 8u);
  EXPECT_EQ(SafetensorsDtypeName(SafetensorsDtype::kI16), "I16");
  std::vector<float> out(2);
  std::vector<uint8_t> bytes(8);
  EXPECT_FALSE(ConvertToFloat32(SafetensorsDtype::kI32, bytes, absl::MakeSpan(out)).ok());
  EXPECT_FALSE(ConvertToFloat32(SafetensorsDtype::kF16, bytes, absl::MakeSpan(out)).ok());
  const std::vector<double> doubles = {1.0 / 3.0, -2.5, 1e300};
  std::vector<float> converted(3);
  ASSERT_TRUE(
      ConvertToFloat32(SafetensorsDtype::kF64, AsBytes(doubles), absl::MakeSpan(converted)).ok());
  EXPECT_EQ(converted[0], static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(converted[1], -2.5f);
  EXPECT_TRUE(std::isinf(converted[2]));
}

TEST(SafetensorsTest, WriteThenReadRoundTrip) {
  const std::vector<float> f32 = {1.5f, -0.0f, 3.25e-40f, std::numeric_limits<float>::infinity(),
                                  7.0f, 1e30f, -2.0f,     0.1f,
                                  0.2f, 0.3f,  0.4f,      0.5f,
                                  0.6f, 0.7f,  0.8f};  // [3, 5]
  const std::vector<float> tricky = {1.0f,     F(0x3f808000), F(0x3f818000), 65520.0f,
                                     65504.0f, F(0x33000001), 5.96e-8f};  // [7]
  const std::vector<uint8_t> bf16 = EncodeBf16(tricky);
  const std::vector<uint8_t> f16 = EncodeF16(tricky);
  const std::vector<int32_t> i32 = {1, -2, 3};
  const std::vector<int64_t> i64 = {int64_t{1} << 40};
  const std::vector<uint8_t> empty;
  const std::vector<TensorToWrite> tensors = {
      {"a.f32", SafetensorsDtype::kF32, {3, 5}, AsBytes(f32)},
      {"b.bf16", SafetensorsDtype::kBF16, {7}, bf16},
      {"c.f16", SafetensorsDtype::kF16, {7, 1}, f16},
      {"d.i32", SafetensorsDtype::kI32, {3}, AsBytes(i32)},
      {"e.i64", SafetensorsDtype::kI64, {}, AsBytes(i64)},
      {"f.empty", SafetensorsDtype::kF32, {4, 0}, empty},
  };
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "megatrain"}}).ok());
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);

  const std::string bytes = ReadBytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);  // data section starts 8-byte aligned
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + header_len + f32.size() * 4 + 14 + 14 + 12 + 8);
  auto serialized = SerializeSafetensors(tensors, {{"format", "pt"}, {"note", "megatrain"}});
  ASSERT_TRUE(serialized.ok());
  EXPECT_EQ(*serialized, bytes);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "megatrain");
  // Data-section order is the given order.
  EXPECT_EQ(file->names(),
            (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.i32", "e.i64", "f.empty"}));
  const SafetensorsTensorInfo* a = file->Find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, SafetensorsDtype::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a->num_elements, 15u);
  EXPECT_EQ(a->begin, 0u);
  EXPECT_EQ(a->end, 60u);
  EXPECT_EQ(file->Find("e.i64")->shape, std::vector<int64_t>{});
  EXPECT_EQ(file->Find("e.i64")->num_elements, 1u);
  EXPECT_EQ(file->Find("missing"), nullptr);

  std::vector<float> out(15);
  ASSERT_TRUE(file->ReadFloat32("a.f32", absl::MakeSpan(out)).ok());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(Bits(out[i]), Bits(f32[i])) << i;

  std::vector<float> b(7), c(7);
  ASSERT_TRUE(file->ReadFloat32("b.bf16", absl::MakeSpan(b)).ok());
  ASSERT_TRUE(file->ReadFloat32("c.f16", absl::MakeSpan(c)).ok());
  const float expected_bf16[] = {1.0f, 1.0f, F(0x3f820000), 65536.0f, 65536.0f, F(0x33000000)};
  const float expected_f16[] = {
      1.0f,     1.00390625f,   1.01171875f,  std::numeric_limits<float>::infinity(),
      65504.0f, F(0x33800000), F(0x33800000)};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Bits(b[i]), Bits(expected_bf16[i])) << i;
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(Bits(b[i]), Bits(kernels::Bf16BitsToFloat32(kernels::Float32ToBf16Bits(tricky[i]))));
  }
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(Bits(c[i]), Bits(static_cast<float>(static_cast<_Float16>(tricky[i])))) << i;
    EXPECT_EQ(Bits(c[i]), Bits(expected_f16[i])) << i;
  }

  std::vector<float> range(4);
  ASSERT_TRUE(file->ReadFloat32Range("a.f32", 11, absl::MakeSpan(range)).ok());
  EXPECT_EQ(range[0], f32[11]);
  EXPECT_EQ(range[3], f32[14]);
  EXPECT_EQ(file->ReadFloat32Range("a.f32", 12, absl::MakeSpan(range)).code(),
            absl::StatusCode::kOutOfRange);

  auto raw = file->RawBytes("d.i32");
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->size(), 12u);
  EXPECT_EQ(std::memcmp(raw->data(), i32.data(), 12), 0);
  EXPECT_EQ(file->RawBytes("nope").status().code(), absl::StatusCode::kNotFound);

  std::vector<float> wrong(3);
  const absl::Status int_read = file->ReadFloat32("d.i32", absl::MakeSpan(wrong));
  EXPECT_THAT(int_read.message(), HasSubstr("d.i32"));
  EXPECT_THAT(int_read.message(), HasSubstr("I32 is not a floating-point type"));
  EXPECT_THAT(file->ReadFloat32("a.f32", absl::MakeSpan(wrong)).message(),
              HasSubstr("has 15 elements; buffer holds 3"));
  std::vector<float> none;
  EXPECT_TRUE(file->ReadFloat32("f.empty", absl::MakeSpan(none)).ok());

  // Move-only handle: the moved-to file still reads; the moved-from one is empty.
  SafetensorsFile moved = std::move(*file);
  ASSERT_TRUE(moved.ReadFloat32("a.f32", absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], 1.5f);
}

// A file from a daemon's held inputs is read with pread: truncated by its owner while a job
// loads it, the next read is DATA_LOSS, never SIGBUS (issue 16, point 4).
TEST(SafetensorsTest, AHeldFileTruncatedWhileReadFailsCleanly) {
  std::vector<float> values(300000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const std::string path = TempPath("held.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{"w", SafetensorsDtype::kF32, {300000}, AsBytes(values)}}).ok());
  InputFiles inputs;
  inputs.Add(path, UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path, &inputs);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<float> out(values.size());
  ASSERT_TRUE(file->ReadFloat32("w", absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, values);
  EXPECT_EQ(file->RawBytes("w").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  const absl::Status s = file->ReadFloat32("w", absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("truncated while being read"));
  // The same by path (a daemon's checkpoints).
  std::vector<float> few(1000);
  ASSERT_TRUE(WriteSafetensors(path, {{"w", SafetensorsDtype::kF32, {1000}, AsBytes(few)}}).ok());
  absl::StatusOr<SafetensorsFile> by_path = SafetensorsFile::OpenUnmapped(path);
  ASSERT_TRUE(by_path.ok()) << by_path.status();
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  EXPECT_EQ(by_path->ReadFloat32("w", absl::MakeSpan(few)).code(), absl::StatusCode::kDataLoss);
  // A path that was not checked is not opened.
  EXPECT_EQ(SafetensorsFile::Open(TempPath("other.safetensors"), &inputs).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SafetensorsTest, EmptyFileWithoutTensors) {
  const std::string path = TempPath("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  EXPECT_EQ(ReadBytes(path).size(), 16u);  // "{}" padded to 8
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors().empty());
  EXPECT_TRUE(file->metadata().empty());
}

TEST(SafetensorsTest, WriterRefusals) {
  const std::vector<float> v = {1, 2, 3};
  const std::string path = TempPath("refused.safetensors");
  absl::Status s = WriteSafetensors(path, {{"w", SafetensorsDtype::kF32, {3}, AsBytes(v)},
                                           {"w", SafetensorsDtype::kF32, {3}, AsBytes(v)}});
  EXPECT_THAT(s.message(), HasSubstr("duplicate tensor name 'w'"));
  s = WriteSafetensors(path, {{"w", SafetensorsDtype::kF32, {4}, AsBytes(v)}});
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w' has 12 bytes"));
  s = WriteSafetensors(path, {{"w", SafetensorsDtype::kF32, {-3}, AsBytes(v)}});
  EXPECT_THAT(s.message(), HasSubstr("negative dimension -3"));
  s = WriteSafetensors(path, {{"__metadata__", SafetensorsDtype::kF32, {3}, AsBytes(v)}});
  EXPECT_THAT(s.message(), HasSubstr("reserved"));
  s = WriteSafetensors("/nonexistent-dir/x.safetensors", {});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

std::string CorpusDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string root = srcdir != nullptr ? std::string(srcdir) + "/megatrain" : ".";
  return root + "/engine/model/testdata/safetensors_corpus";
}

TEST(SafetensorsCorpusTest, EveryMalformedFileIsRefusedWithItsError) {
  const auto cases = MalformedSafetensorsCases();
  ASSERT_GE(cases.size(), 25u);
  for (const SafetensorsCorpusCase& c : cases) {
    // Freshly generated...
    const std::string path = TempPath(c.file_name);
    WriteBytes(path, c.bytes);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << c.file_name;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << c.file_name;
    EXPECT_THAT(file.status().message(), HasSubstr(c.expected_error)) << c.file_name;
    EXPECT_THAT(file.status().message(), HasSubstr(path)) << c.file_name;
    // ...and the committed copy, which must be up to date.
    const std::string committed = CorpusDir() + "/" + c.file_name;
    EXPECT_EQ(ReadBytes(committed), c.bytes)
        << committed << " is stale: run bazel run //engine/model:safetensors_corpus_gen -- "
        << "$PWD/engine/model/testdata/safetensors_corpus";
    auto committed_file = SafetensorsFile::Open(committed);
    ASSERT_FALSE(committed_file.ok()) << committed;
    EXPECT_THAT(committed_file.status().message(), HasSubstr(c.expected_error)) << committed;
  }
}

TEST(SafetensorsCorpusTest, EveryPrefixAndByteFlipOfAValidFileIsHandled) {
  const std::vector<float> v = {1, 2, 3, 4, 5};
  const std::vector<int32_t> w = {7, 8};
  auto bytes = SerializeSafetensors({{"v", SafetensorsDtype::kF32, {5}, AsBytes(v)},
                                     {"w", SafetensorsDtype::kI32, {1, 2}, AsBytes(w)}},
                                    {{"k", "v"}});
  ASSERT_TRUE(bytes.ok());
  const std::string path = TempPath("mutated.safetensors");
  for (size_t n = 0; n < bytes->size(); ++n) {
    WriteBytes(path, bytes->substr(0, n));
    EXPECT_FALSE(SafetensorsFile::Open(path).ok()) << "prefix " << n;
  }
  for (size_t i = 0; i < bytes->size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::string mutated = *bytes;
      mutated[i] = static_cast<char>(mutated[i] ^ flip);
      WriteBytes(path, mutated);
      auto file = SafetensorsFile::Open(path);  // may succeed (data bytes); must not crash
      if (file.ok() && file->Find("v") != nullptr &&
          file->Find("v")->dtype == SafetensorsDtype::kF32) {
        std::vector<float> out(file->Find("v")->num_elements);
        EXPECT_TRUE(file->ReadFloat32("v", absl::MakeSpan(out)).ok());
      }
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
