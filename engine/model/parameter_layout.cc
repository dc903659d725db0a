// ParameterLayout: how a model's tensors pack into one contiguous fp32 buffer per entry.
#include "engine/model/parameter_layout.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace megatrain::engine {
namespace {

size_t AlignUp(size_t n) {
  return (n + kTensorAlignmentFloats - 1) / kTensorAlignmentFloats * kTensorAlignmentFloats;
}

class EntryBuilder {
 public:
  EntryBuilder(EntryKind kind, int layer) {
    entry_.kind = kind;
    entry_.layer = layer;
  }

  void Add(std::string name, TensorRole role, std::vector<int64_t> shape) {
    TensorSlot slot;
    slot.hf_name = std::move(name);
    slot.offset = end_;
    slot.shape = std::move(shape);
    slot.weight_decay = slot.shape.size() == 2;
    slot.role = role;
    end_ = AlignUp(end_ + slot.num_elements());
    entry_.tensors.push_back(std::move(slot));
  }

  LayoutEntry Finish() {
    entry_.num_elements = end_;
    return std::move(entry_);
  }

 private:
  LayoutEntry entry_;
  size_t end_ = 0;
};

LayoutEntry BuildLayer(const ModelConfig& c, int i) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t d = c.hidden_size, f = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
  EntryBuilder b(EntryKind::kLayer, i);
  b.Add(p + "input_layernorm.weight", TensorRole::kInputNorm, {d});
  b.Add(p + "self_attn.q_proj.weight", TensorRole::kQ, {q, d});
  if (c.qkv_bias) b.Add(p + "self_attn.q_proj.bias", TensorRole::kQBias, {q});
  if (c.qk_norm) b.Add(p + "self_attn.q_norm.weight", TensorRole::kQNorm, {c.head_dim});
  b.Add(p + "self_attn.k_proj.weight", TensorRole::kK, {kv, d});
  if (c.qkv_bias) b.Add(p + "self_attn.k_proj.bias", TensorRole::kKBias, {kv});
  if (c.qk_norm) b.Add(p + "self_attn.k_norm.weight", TensorRole::kKNorm, {c.head_dim});
  b.Add(p + "self_attn.v_proj.weight", TensorRole::kV, {kv, d});
  if (c.qkv_bias) b.Add(p + "self_attn.v_proj.bias", TensorRole::kVBias, {kv});
  b.Add(p + "self_attn.o_proj.weight", TensorRole::kO, {d, q});
  if (c.o_bias) b.Add(p + "self_attn.o_proj.bias", TensorRole::kOBias, {d});
  b.Add(p + "post_attention_layernorm.weight", TensorRole::kPostAttentionNorm, {d});
  b.Add(p + "mlp.gate_proj.weight", TensorRole::kGate, {f, d});
  if (c.mlp_bias) b.Add(p + "mlp.gate_proj.bias", TensorRole::kGateBias, {f});
  b.Add(p + "mlp.up_proj.weight", TensorRole::kUp, {f, d});
  if (c.mlp_bias) b.Add(p + "mlp.up_proj.bias", TensorRole::kUpBias, {f});
  b.Add(p + "mlp.down_proj.weight", TensorRole::kDown, {d, f});
  if (c.mlp_bias) b.Add(p + "mlp.down_proj.bias", TensorRole::kDownBias, {d});
  return b.Finish();
}

}  // namespace

size_t TensorSlot::num_elements() const {
  size_t n = 1;
  for (int64_t dim : shape) n *= static_cast<size_t>(dim);
  return n;
}

std::string_view TensorRoleName(TensorRole role) {
  // In TensorRole order (tensor_role.h): a layer's roles, then the others.
  static constexpr std::string_view kNames[kNumTensorRoles] = {"input_norm",
                                                               "q",
                                                               "q_bias",
                                                               "q_norm",
                                                               "k",
                                                               "k_bias",
                                                               "k_norm",
                                                               "v",
                                                               "v_bias",
                                                               "o",
                                                               "o_bias",
                                                               "post_attention_norm",
                                                               "gate",
                                                               "gate_bias",
                                                               "up",
                                                               "up_bias",
                                                               "down",
                                                               "down_bias",
                                                               "embedding",
                                                               "final_norm",
                                                               "lm_head"};
  return kNames[static_cast<int>(role)];
}

std::string_view EntryKindName(EntryKind kind) {
  switch (kind) {
    case EntryKind::kEmbedding:
      return "embedding";
    case EntryKind::kLayer:
      return "layer";
    case EntryKind::kFinalNorm:
      return "final_norm";
    case EntryKind::kLmHead:
      return "lm_head";
  }
  return "?";
}

absl::StatusOr<ParameterLayout> ParameterLayout::Create(const ModelConfig& config) {
  if (config.vocab_size <= 0 || config.hidden_size <= 0 || config.intermediate_size <= 0 ||
      config.num_hidden_layers <= 0 || config.num_attention_heads <= 0 ||
      config.num_key_value_heads <= 0 || config.head_dim <= 0) {
    return absl::InvalidArgumentError(
        "ParameterLayout: config has a non-positive size; parse it with ParseModelConfig");
  }
  ParameterLayout layout;
  layout.num_layers_ = config.num_hidden_layers;
  layout.tied_ = config.tie_word_embeddings;
  const int64_t v = config.vocab_size, d = config.hidden_size;
  {
    EntryBuilder b(EntryKind::kEmbedding, -1);
    b.Add("model.embed_tokens.weight", TensorRole::kEmbedding, {v, d});
    layout.entries_.push_back(b.Finish());
  }
  for (int i = 0; i < config.num_hidden_layers; ++i)
    layout.entries_.push_back(BuildLayer(config, i));
  {
    EntryBuilder b(EntryKind::kFinalNorm, -1);
    b.Add("model.norm.weight", TensorRole::kFinalNorm, {d});
    layout.entries_.push_back(b.Finish());
  }
  if (!config.tie_word_embeddings) {
    EntryBuilder b(EntryKind::kLmHead, -1);
    b.Add("lm_head.weight", TensorRole::kLmHead, {v, d});
    layout.entries_.push_back(b.Finish());
  }
  for (int e = 0; e < layout.num_entries(); ++e) {
    const LayoutEntry& entry = layout.entries_[e];
    std::array<int, kNumTensorRoles> roles;
    roles.fill(-1);
    for (int s = 0; s < static_cast<int>(entry.tensors.size()); ++s) {
      const TensorSlot& slot = entry.tensors[s];
      roles[static_cast<int>(slot.role)] = s;
      layout.name_index_[slot.hf_name] = {e, s};
      layout.parameter_count_ += static_cast<int64_t>(slot.num_elements());
    }
    layout.role_index_.push_back(roles);
    layout.padded_element_count_ += static_cast<int64_t>(entry.num_elements);
  }
  return layout;
}

absl::StatusOr<TensorLocation> ParameterLayout::Find(std::string_view hf_name) const {
  auto it = name_index_.find(absl::string_view(hf_name.data(), hf_name.size()));
  if (it == name_index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("parameter layout has no tensor '", std::string(hf_name), "'"));
  }
  const auto [entry, slot] = it->second;
  return TensorLocation{entry, &entries_[entry].tensors[slot]};
}

const TensorSlot* ParameterLayout::Find(int entry, TensorRole role) const {
  if (entry < 0 || entry >= num_entries()) return nullptr;
  const int slot = role_index_[entry][static_cast<int>(role)];
  return slot < 0 ? nullptr : &entries_[entry].tensors[slot];
}

std::string ParameterLayout::DescribeTable() const {
  std::string out;
  for (int e = 0; e < num_entries(); ++e) {
    const LayoutEntry& entry = entries_[e];
    absl::StrAppend(&out, "# entry ", e, " ", std::string(EntryKindName(entry.kind)));
    if (entry.kind == EntryKind::kLayer) absl::StrAppend(&out, " ", entry.layer);
    absl::StrAppend(&out, ": ", entry.num_elements, " floats\n");
    for (const TensorSlot& slot : entry.tensors) {
      absl::StrAppend(&out, slot.hf_name, "  entry=", e, " offset=", slot.offset, " shape=[",
                      absl::StrJoin(slot.shape, ", "), "]", slot.weight_decay ? " decay" : "",
                      "\n");
    }
  }
  absl::StrAppend(&out, "parameters=", parameter_count_, " padded_floats=", padded_element_count_,
                  "\n");
  return out;
}

}  // namespace megatrain::engine
