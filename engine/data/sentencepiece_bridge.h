// Absl-free wrapper of libsentencepiece: its header declares absl::string_view
// as std::string_view, which clashes with Debian's absl, so only this file's
// .cc includes it and everything else talks to SentencePiece through here.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace megatrain::engine {

class SentencePieceModel {
 public:
  // nullptr with `error` set when the file cannot be loaded as a model.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  // The same from the model file's bytes (read by the caller from a checked descriptor).
  static std::unique_ptr<SentencePieceModel> LoadFromBytes(const std::string& bytes,
                                                           std::string* error);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  int piece_count() const;
  int eos_id() const;  // -1 when the model has no end-of-sentence piece
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  // `ids` must lie in [0, piece_count()); control pieces decode to nothing.
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;

 private:
  SentencePieceModel();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace megatrain::engine
