// Byte and SentencePiece tokenizers (see text_tokenizer.h).
#include "engine/data/text_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/sentencepiece_bridge.h"

namespace megatrain::engine {
namespace {

constexpr std::string_view kDocumentSeparator = "\n---\n";

absl::Status CheckIds(absl::Span<const int32_t> tokens, int vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is id ", tokens[i],
                                                     ", outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int ByteTextTokenizer::vocab_size() const { return ByteTokenizer::kVocabSize; }

int32_t ByteTextTokenizer::end_of_document() const { return ByteTokenizer::kEndOfDocument; }

absl::Status ByteTextTokenizer::Encode(std::string_view text, std::vector<int32_t>* tokens) const {
  ByteTokenizer::Encode(text, tokens);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ByteTextTokenizer::Decode(absl::Span<const int32_t> tokens) const {
  if (absl::Status s = CheckIds(tokens, vocab_size()); !s.ok()) return s;
  return ByteTokenizer::Decode(std::vector<int32_t>(tokens.begin(), tokens.end()));
}

SentencePieceTokenizer::SentencePieceTokenizer(std::string path,
                                               std::unique_ptr<SentencePieceModel> model)
    : path_(std::move(path)), model_(std::move(model)) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path, const InputFiles* inputs) {
  std::string error;
  std::unique_ptr<SentencePieceModel> model;
  if (inputs == nullptr) {
    model = SentencePieceModel::Load(path, &error);
  } else {
    absl::StatusOr<std::string> bytes = inputs->Read(path);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat("tokenizer: ", bytes.status().message()));
    }
    model = SentencePieceModel::LoadFromBytes(*bytes, &error);
  }
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer '", path, "' is not a SentencePiece model: ", error));
  }
  if (model->eos_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer '", path, "' has no end-of-sentence piece (eos_id=-1) to separate documents"));
  }
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(path, std::move(model)));
}

int SentencePieceTokenizer::vocab_size() const { return model_->piece_count(); }

int32_t SentencePieceTokenizer::end_of_document() const { return model_->eos_id(); }

absl::Status SentencePieceTokenizer::Encode(std::string_view text,
                                            std::vector<int32_t>* tokens) const {
  std::vector<int> ids;
  std::string error;
  if (!model_->Encode(text, &ids, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer '", path_, "': ", error));
  }
  tokens->insert(tokens->end(), ids.begin(), ids.end());
  return absl::OkStatus();
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(absl::Span<const int32_t> tokens) const {
  if (absl::Status s = CheckIds(tokens, vocab_size()); !s.ok()) return s;
  std::string text;
  std::vector<int> segment;
  auto flush = [&]() -> absl::Status {
    std::string piece_text, error;
    if (!model_->Decode(segment, &piece_text, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer '", path_, "': ", error));
    }
    text += piece_text;
    segment.clear();
    return absl::OkStatus();
  };
  for (int32_t t : tokens) {
    if (t == end_of_document()) {
      if (absl::Status s = flush(); !s.ok()) return s;
      text += kDocumentSeparator;
    } else {
      segment.push_back(t);
    }
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  return text;
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> CreateTextTokenizer(const std::string& spec,
                                                                   const InputFiles* inputs) {
  if (spec == "bytes") return std::make_unique<ByteTextTokenizer>();
  if (spec.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer is empty: use \"bytes\" or a SentencePiece .model");
  }
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> sp =
      SentencePieceTokenizer::Load(spec, inputs);
  if (!sp.ok()) return sp.status();
  return std::unique_ptr<TextTokenizer>(std::move(*sp));
}

absl::StatusOr<std::vector<int32_t>> TokenizeDocuments(const std::vector<std::string>& documents,
                                                       const TextTokenizer& tokenizer) {
  std::vector<int32_t> tokens;
  for (const std::string& d : documents) {
    if (absl::Status s = tokenizer.Encode(d, &tokens); !s.ok()) return s;
    tokens.push_back(tokenizer.end_of_document());
  }
  return tokens;
}

}  // namespace megatrain::engine
