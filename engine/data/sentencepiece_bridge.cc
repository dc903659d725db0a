// SentencePiece bridge implementation (the only includer of sentencepiece_processor.h).
#include "engine/data/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>

namespace megatrain::engine {

SentencePieceModel::SentencePieceModel()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  const sentencepiece::util::Status status = model->processor_->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return model;
}

std::unique_ptr<SentencePieceModel> SentencePieceModel::LoadFromBytes(const std::string& bytes,
                                                                      std::string* error) {
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  const sentencepiece::util::Status status = model->processor_->LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return model;
}

int SentencePieceModel::piece_count() const { return processor_->GetPieceSize(); }

int SentencePieceModel::eos_id() const { return processor_->eos_id(); }

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  const sentencepiece::util::Status status = processor_->Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceModel::Decode(const std::vector<int>& ids, std::string* text,
                                std::string* error) const {
  const sentencepiece::util::Status status = processor_->Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

}  // namespace megatrain::engine
