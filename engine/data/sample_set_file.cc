// Sample-set files: header checks, on-demand reads, and the writer (see sample_set_file.h).
#include "engine/data/sample_set_file.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/common/file_io.h"
#include "engine/data/checked_input_file.h"

namespace megatrain::engine {
namespace {

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian host
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void AppendU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void AppendU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }

absl::Status FieldError(const std::string& path, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": sample-set ", field, " ", what));
}

}  // namespace

absl::StatusOr<SampleSetFile> SampleSetFile::Open(const std::string& path,
                                                  const InputFiles* inputs) {
  // Read on demand, never mapped: a file truncated under the run fails a read (DATA_LOSS)
  // instead of raising SIGBUS; a regular file only, so a FIFO cannot block the caller.
  absl::StatusOr<CheckedInputFile> file = OpenCheckedInputFile(path, inputs);
  if (!file.ok()) return file.status();
  const uint64_t size = file->size;
  SampleSetFile f;
  f.path_ = path;
  f.fd_ = std::move(file->fd);
  uint8_t header[kSampleSetHeaderBytes];
  if (size < kSampleSetHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size, " bytes: truncated at offset ", size,
                                            " inside the ", kSampleSetHeaderBytes,
                                            "-byte sample-set header"));
  }
  if (absl::Status s = PreadExactly(f.fd_.get(), 0, header, sizeof(header), path); !s.ok()) {
    return s;
  }
  if (std::memcmp(header, kSampleSetMagic, sizeof(kSampleSetMagic)) != 0) {
    return FieldError(path, "magic", "(offset 0) is not \"MTSFT\\0\\0\\x01\"");
  }
  const uint64_t n = LoadU64(header + 8);
  const uint64_t t = LoadU64(header + 16);
  const uint32_t v = LoadU32(header + 24);
  const uint32_t reserved = LoadU32(header + 28);
  if (reserved != 0)
    return FieldError(path, "reserved field", absl::StrCat("(offset 28) is ", reserved, ", not 0"));
  // Bounds before any arithmetic on them: the file must hold the arrays the fields describe.
  if (n > size / 8)
    return FieldError(
        path, "N",
        absl::StrCat("(offset 8) = ", n, " is more samples than a ", size, "-byte file can index"));
  if (t > size)
    return FieldError(
        path, "T",
        absl::StrCat("(offset 16) = ", t, " is more tokens than a ", size, "-byte file holds"));
  if (t == 0 && v != 0)
    return FieldError(path, "V", absl::StrCat("(offset 24) = ", v, " but T = 0 (must be 0)"));
  if (t > 0 && v == 0) return FieldError(path, "V", absl::StrCat("(offset 24) = 0 but T = ", t));
  if (v > static_cast<uint64_t>(INT32_MAX) + 1) {
    return FieldError(path, "V", absl::StrCat("(offset 24) = ", v, " exceeds 2^31"));
  }
  const uint64_t offsets_bytes = (n + 1) * 8;
  const uint64_t expected = kSampleSetHeaderBytes + offsets_bytes + t * 4 + t;
  if (size < expected) {
    return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", size, ": N = ", n,
                                            " and T = ", t, " need ", expected, " bytes"));
  }
  if (size > expected) {
    return FieldError(path, "size",
                      absl::StrCat(size, " bytes is more than the ", expected, " that N = ", n,
                                   " and T = ", t, " describe"));
  }
  std::vector<uint8_t> raw(offsets_bytes);
  if (absl::Status s =
          PreadExactly(f.fd_.get(), kSampleSetHeaderBytes, raw.data(), raw.size(), path);
      !s.ok()) {
    return s;
  }
  f.offsets_.resize(n + 1);
  for (uint64_t i = 0; i <= n; ++i) f.offsets_[i] = LoadU64(raw.data() + i * 8);
  if (f.offsets_[0] != 0) {
    return FieldError(path, "offset o[0]",
                      absl::StrCat("(offset 32) = ", f.offsets_[0], ", not 0"));
  }
  for (uint64_t i = 1; i <= n; ++i) {
    if (f.offsets_[i] < f.offsets_[i - 1] || f.offsets_[i] > t) {
      return FieldError(
          path, absl::StrCat("offset o[", i, "]"),
          absl::StrCat("(offset ", kSampleSetHeaderBytes + i * 8, ") = ", f.offsets_[i],
                       " is not in [o[", i - 1, "] = ", f.offsets_[i - 1], ", T = ", t, "]"));
    }
  }
  if (f.offsets_[n] != t) {
    return FieldError(path, absl::StrCat("offset o[N] = o[", n, "]"),
                      absl::StrCat("= ", f.offsets_[n], " is not T = ", t));
  }
  f.vocab_bound_ = v;
  f.tokens_at_ = kSampleSetHeaderBytes + offsets_bytes;
  f.mask_at_ = f.tokens_at_ + t * 4;
  return f;
}

absl::Status SampleSetFile::ReadSample(size_t index, size_t count, Sample* out) const {
  if (index >= samples() || count > SampleLength(index)) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": sample ", index, " (", count,
                                              " tokens) outside its ", samples(), " samples"));
  }
  const uint64_t first = offsets_[index];
  std::vector<uint32_t> raw(count);
  out->tokens.resize(count);
  out->mask.resize(count);
  if (absl::Status s =
          PreadExactly(fd_.get(), tokens_at_ + first * 4, raw.data(), count * 4, path_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = PreadExactly(fd_.get(), mask_at_ + first, out->mask.data(), count, path_);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < count; ++i) {
    if (raw[i] >= vocab_bound_) {
      return absl::DataLossError(absl::StrCat(path_, ": sample ", index, " token ", i, " = ",
                                              raw[i],
                                              " is not below the header's V = ", vocab_bound_));
    }
    if (out->mask[i] > 1) {
      return absl::DataLossError(absl::StrCat(path_, ": sample ", index, " mask byte ", i, " = ",
                                              static_cast<int>(out->mask[i]), " is not 0 or 1"));
    }
    out->tokens[i] = static_cast<int32_t>(raw[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleSetFiles> SampleSetFiles::Open(const std::vector<std::string>& paths,
                                                    const InputFiles* inputs) {
  if (paths.empty()) return absl::InvalidArgumentError("no sample-set files given");
  SampleSetFiles out;
  for (const std::string& p : paths) {
    absl::StatusOr<SampleSetFile> f = SampleSetFile::Open(p, inputs);
    if (!f.ok()) return f.status();
    out.starts_.push_back(out.total_);
    out.total_ += f->samples();
    out.vocab_bound_ = std::max(out.vocab_bound_, f->vocab_bound());
    out.files_.push_back(*std::move(f));
  }
  return out;
}

std::pair<const SampleSetFile*, size_t> SampleSetFiles::Locate(size_t index) const {
  const size_t file = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), index) -
                                          starts_.begin() - 1);
  // Files with no samples share a start with the next one: upper_bound skips past them.
  return {&files_[file], index - starts_[file]};
}

size_t SampleSetFiles::SampleLength(size_t index) const {
  auto [file, local] = Locate(index);
  return file->SampleLength(local);
}

absl::Status SampleSetFiles::ReadSample(size_t index, size_t count, Sample* out) const {
  if (index >= total_) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " outside ", total_));
  }
  auto [file, local] = Locate(index);
  return file->ReadSample(local, count, out);
}

VectorSamples::VectorSamples(std::vector<Sample> samples) : samples_(std::move(samples)) {
  for (const Sample& s : samples_) {
    for (int32_t t : s.tokens) vocab_bound_ = std::max(vocab_bound_, static_cast<uint32_t>(t) + 1);
  }
}

absl::Status VectorSamples::ReadSample(size_t index, size_t count, Sample* out) const {
  if (index >= samples_.size() || count > samples_[index].tokens.size()) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " outside ", samples_.size()));
  }
  const Sample& s = samples_[index];
  out->tokens.assign(s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(count));
  out->mask.assign(s.mask.begin(), s.mask.begin() + static_cast<std::ptrdiff_t>(count));
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeSampleSet(const std::vector<Sample>& samples) {
  uint64_t total = 0;
  uint32_t bound = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    if (s.mask.size() != s.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", i, ": ", s.tokens.size(),
                                                     " tokens but ", s.mask.size(), " mask bytes"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0) return absl::InvalidArgumentError(absl::StrCat("sample ", i, ": token id ", t));
      bound = std::max(bound, static_cast<uint32_t>(t) + 1);
    }
    total += s.tokens.size();
  }
  std::string out(reinterpret_cast<const char*>(kSampleSetMagic), sizeof(kSampleSetMagic));
  AppendU64(&out, samples.size());
  AppendU64(&out, total);
  AppendU32(&out, bound);
  AppendU32(&out, 0);
  uint64_t offset = 0;
  AppendU64(&out, 0);
  for (const Sample& s : samples) AppendU64(&out, offset += s.tokens.size());
  for (const Sample& s : samples) {
    for (int32_t t : s.tokens) AppendU32(&out, static_cast<uint32_t>(t));
  }
  for (const Sample& s : samples) {
    for (uint8_t m : s.mask) out.push_back(static_cast<char>(m != 0 ? 1 : 0));
  }
  return out;
}

absl::Status WriteSampleSetFile(const std::string& path, const std::vector<Sample>& samples) {
  absl::StatusOr<std::string> bytes = EncodeSampleSet(samples);
  if (!bytes.ok()) return bytes.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write sample-set file '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
