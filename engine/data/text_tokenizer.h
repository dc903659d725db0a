// Text tokenizers behind one interface: bytes (token = byte value, end of
// document 0) and SentencePiece models (end of document = the model's eos id).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/input_files.h"

namespace megatrain::engine {

class SentencePieceModel;

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // "bytes", or the path of the SentencePiece model.
  virtual const std::string& name() const = 0;
  virtual int vocab_size() const = 0;
  // The id placed after every document.
  virtual int32_t end_of_document() const = 0;
  // Appends the tokens of `text` (no end-of-document marker).
  virtual absl::Status Encode(std::string_view text, std::vector<int32_t>* tokens) const = 0;
  // Documents are joined by "\n---\n" where end-of-document ids occur; ids
  // outside the vocabulary are InvalidArgument.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> tokens) const = 0;
};

// Bytes: a NUL byte in text is dropped (0 is the end-of-document id).
class ByteTextTokenizer : public TextTokenizer {
 public:
  const std::string& name() const override { return name_; }
  int vocab_size() const override;
  int32_t end_of_document() const override;
  absl::Status Encode(std::string_view text, std::vector<int32_t>* tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> tokens) const override;

 private:
  std::string name_ = "bytes";
};

class SentencePieceTokenizer : public TextTokenizer {
 public:
  // Refused with the path named: unreadable or invalid model files, and models
  // without an end-of-sentence piece (documents could not be separated).
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(
      const std::string& path, const InputFiles* inputs = nullptr);
  ~SentencePieceTokenizer() override;

  const std::string& name() const override { return path_; }
  int vocab_size() const override;
  int32_t end_of_document() const override;
  absl::Status Encode(std::string_view text, std::vector<int32_t>* tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> tokens) const override;

 private:
  SentencePieceTokenizer(std::string path, std::unique_ptr<SentencePieceModel> model);
  std::string path_;
  std::unique_ptr<SentencePieceModel> model_;
};

// "bytes" or the path of a SentencePiece .model file (read from its checked descriptor in
// `inputs` when given: a daemon's run).
absl::StatusOr<std::unique_ptr<TextTokenizer>> CreateTextTokenizer(
    const std::string& spec, const InputFiles* inputs = nullptr);

// Every document's tokens followed by the end-of-document id, in order.
absl::StatusOr<std::vector<int32_t>> TokenizeDocuments(const std::vector<std::string>& documents,
                                                       const TextTokenizer& tokenizer);

}  // namespace megatrain::engine
