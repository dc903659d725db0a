// SFT sample-set files ("MTSFT", docs/data.md): samples of token ids, each token with a loss
// mask byte, read on demand with pread (never mapped), plus the small writer tests and tools use.
//
// Layout (little-endian):
//   offset 0   8 bytes   magic "MTSFT" 0x00 0x00 0x01
//   offset 8   u64       N = samples
//   offset 16  u64       T = total tokens
//   offset 24  u32       V = 1 + the largest token id (0 when T = 0)
//   offset 28  u32       reserved, 0
//   offset 32  u64[N+1]  sample offsets into the token array (0 = o[0] <= ... <= o[N] = T)
//   then       u32[T]    token ids
//   then       u8[T]     loss mask: 1 = the loss term that predicts this token counts
// The first token of a sample is never predicted; its mask byte has no meaning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {

inline constexpr uint8_t kSampleSetMagic[8] = {'M', 'T', 'S', 'F', 'T', 0x00, 0x00, 0x01};
inline constexpr size_t kSampleSetHeaderBytes = 32;

// One sample: its token ids and one mask byte per token (0 or 1).
struct Sample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

// A read-only, indexed sequence of samples.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual size_t samples() const = 0;
  virtual size_t SampleLength(size_t index) const = 0;  // tokens of sample `index`
  // The first `count` tokens and mask bytes of sample `index` (count <= SampleLength(index)).
  virtual absl::Status ReadSample(size_t index, size_t count, Sample* out) const = 0;
  // 1 + the largest token id of every sample (the files' V fields).
  virtual uint32_t vocab_bound() const = 0;
};

// One sample-set file. Open checks every header field and the size (errors name the file and the
// field); the offsets are held in memory (8 bytes per sample), tokens and masks are read on demand.
class SampleSetFile {
 public:
  static absl::StatusOr<SampleSetFile> Open(const std::string& path,
                                            const InputFiles* inputs = nullptr);
  SampleSetFile(SampleSetFile&&) noexcept = default;
  SampleSetFile& operator=(SampleSetFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  size_t samples() const { return offsets_.size() - 1; }
  uint64_t tokens() const { return offsets_.back(); }
  uint32_t vocab_bound() const { return vocab_bound_; }
  size_t SampleLength(size_t index) const {
    return static_cast<size_t>(offsets_[index + 1] - offsets_[index]);
  }
  // As SampleSource::ReadSample. A file cut short under the run is DATA_LOSS naming it and the
  // offset; a token id >= V or a mask byte other than 0/1 is DATA_LOSS naming the sample.
  absl::Status ReadSample(size_t index, size_t count, Sample* out) const;

 private:
  SampleSetFile() = default;
  std::string path_;
  UniqueFd fd_;
  std::vector<uint64_t> offsets_;  // N + 1
  uint32_t vocab_bound_ = 0;
  uint64_t tokens_at_ = 0;  // byte offset of the token array
  uint64_t mask_at_ = 0;    // byte offset of the mask array
};

// Several files read as one set, samples numbered in file order.
class SampleSetFiles : public SampleSource {
 public:
  static absl::StatusOr<SampleSetFiles> Open(const std::vector<std::string>& paths,
                                             const InputFiles* inputs = nullptr);
  size_t samples() const override { return total_; }
  size_t SampleLength(size_t index) const override;
  absl::Status ReadSample(size_t index, size_t count, Sample* out) const override;
  uint32_t vocab_bound() const override { return vocab_bound_; }

 private:
  // The file holding global sample `index` and the index within it.
  std::pair<const SampleSetFile*, size_t> Locate(size_t index) const;
  std::vector<SampleSetFile> files_;
  std::vector<size_t> starts_;  // first global sample of each file
  size_t total_ = 0;
  uint32_t vocab_bound_ = 0;
};

// Samples held in memory (tests).
class VectorSamples : public SampleSource {
 public:
  explicit VectorSamples(std::vector<Sample> samples);
  size_t samples() const override { return samples_.size(); }
  size_t SampleLength(size_t index) const override { return samples_[index].tokens.size(); }
  absl::Status ReadSample(size_t index, size_t count, Sample* out) const override;
  uint32_t vocab_bound() const override { return vocab_bound_; }

 private:
  std::vector<Sample> samples_;
  uint32_t vocab_bound_ = 0;
};

// The bytes of a sample-set file holding `samples` (token ids must be >= 0, masks as long as
// the tokens); InvalidArgument naming the sample otherwise.
absl::StatusOr<std::string> EncodeSampleSet(const std::vector<Sample>& samples);
// EncodeSampleSet written to `path` (created or replaced).
absl::Status WriteSampleSetFile(const std::string& path, const std::vector<Sample>& samples);

}  // namespace megatrain::engine
