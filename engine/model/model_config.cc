// ModelConfig: the decoder architecture read from a Hugging Face config.json, validated once.
#include "engine/model/model_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/safe_files.h"
#include "engine/common/strict_json.h"

namespace megatrain::engine {
namespace {

using Json = nlohmann::json;

// Keys found in real Llama 2/3/3.1/3.2, Qwen2/2.5 and Mistral config.json files
// (or written by transformers' generic PretrainedConfig) that do not change the
// forward or backward computation: ids of special tokens, storage dtype,
// provenance, inference-time switches and generation defaults. Anything not
// here and not parsed below is refused.
constexpr std::string_view kBenignKeys[] = {
    "_name_or_path",
    "_attn_implementation_autoset",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
    "initializer_range",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "tokenizer_class",
    // Generation defaults (older transformers copied them into config.json).
    "max_length",
    "min_length",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "num_beams",
    "length_penalty",
    "no_repeat_ngram_size",
    "early_stopping",
    "num_return_sequences",
};

// Keys of the source checkpoint that ToJson replaces rather than copies.
constexpr std::string_view kSourceOnlyKeys[] = {"torch_dtype", "dtype", "transformers_version"};

// Bounds that keep every derived product far inside int64.
constexpr int64_t kMaxVocab = std::numeric_limits<int32_t>::max();  // token ids are int32
constexpr int64_t kMaxWidth = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 1 << 14;
constexpr int64_t kMaxHeads = 1 << 16;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

std::string Show(const Json& value) { return JsonForMessage(value); }

absl::Status Bad(absl::string_view key, const Json& value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: '", key, "' = ", Show(value), ": ", why));
}

absl::Status Unsupported(absl::string_view key, const Json& value) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: unsupported key '", key, "' = ",
                                                 Show(value), "; megatrain does not implement it"));
}

absl::StatusOr<int64_t> AsInt(absl::string_view key, const Json& value, int64_t min, int64_t max) {
  if (!value.is_number_integer()) return Bad(key, value, "must be an integer");
  int64_t result;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      return Bad(key, value, absl::StrCat("must be in [", min, ", ", max, "]"));
    }
    result = static_cast<int64_t>(u);
  } else {
    result = value.get<int64_t>();
  }
  if (result < min || result > max) {
    return Bad(key, value, absl::StrCat("must be in [", min, ", ", max, "]"));
  }
  return result;
}

absl::StatusOr<double> AsPositiveFinite(absl::string_view key, const Json& value) {
  if (!value.is_number()) return Bad(key, value, "must be a number");
  const double d = value.get<double>();
  if (!std::isfinite(d) || d <= 0.0) return Bad(key, value, "must be a finite number > 0");
  return d;
}

absl::StatusOr<bool> AsBool(absl::string_view key, const Json& value) {
  if (!value.is_boolean()) return Bad(key, value, "must be true or false");
  return value.get<bool>();
}

absl::string_view CausalLmClass(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama:
      return "LlamaForCausalLM";
    case ModelFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case ModelFamily::kMistral:
      return "MistralForCausalLM";
    case ModelFamily::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "";
}

// Parses a rope_scaling / rope_parameters object. `prefix` names it in errors.
// rope_parameters (transformers v5) may also carry rope_theta.
absl::Status ParseRopeObject(absl::string_view prefix, const Json& object, bool allow_theta,
                             Llama3RopeScaling* scaling, std::optional<double>* theta) {
  if (!object.is_object()) return Bad(prefix, object, "must be an object or null");
  std::optional<std::string> type;
  for (const char* type_key : {"rope_type", "type"}) {
    auto it = object.find(type_key);
    if (it == object.end()) continue;
    const std::string key = absl::StrCat(prefix, ".", type_key);
    if (!it->is_string()) return Bad(key, *it, "must be a string");
    if (type.has_value() && *type != it->get<std::string>()) {
      return Bad(key, *it, absl::StrCat("disagrees with the other rope type \"", *type, "\""));
    }
    type = it->get<std::string>();
    if (*type != "default" && *type != "llama3") {
      return Bad(key, *it,
                 "is not supported; megatrain implements plain RoPE (\"default\") and \"llama3\" "
                 "scaling only");
    }
  }
  if (!type.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: '", prefix, "' has no rope_type: ", Show(object)));
  }
  const bool llama3 = *type == "llama3";
  Llama3RopeScaling parsed;
  parsed.enabled = llama3;
  std::set<std::string> seen;
  for (const auto& [key, value] : object.items()) {
    const std::string name = absl::StrCat(prefix, ".", key);
    if (key == "rope_type" || key == "type") continue;
    if (key == "rope_theta" && allow_theta) {
      auto t = AsPositiveFinite(name, value);
      if (!t.ok()) return t.status();
      *theta = *t;
    } else if (llama3 && key == "factor") {
      auto f = AsPositiveFinite(name, value);
      if (!f.ok()) return f.status();
      if (*f < 1.0) return Bad(name, value, "must be >= 1");
      parsed.factor = *f;
    } else if (llama3 && key == "low_freq_factor") {
      auto f = AsPositiveFinite(name, value);
      if (!f.ok()) return f.status();
      parsed.low_freq_factor = *f;
    } else if (llama3 && key == "high_freq_factor") {
      auto f = AsPositiveFinite(name, value);
      if (!f.ok()) return f.status();
      parsed.high_freq_factor = *f;
    } else if (llama3 && key == "original_max_position_embeddings") {
      auto n = AsInt(name, value, 1, kMaxPositions);
      if (!n.ok()) return n.status();
      parsed.original_max_position_embeddings = *n;
    } else {
      return Unsupported(name, value);
    }
    seen.insert(key);
  }
  if (llama3) {
    for (const char* required :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!seen.count(required)) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: '", prefix, ".", required,
                                                       "' is required for llama3 rope scaling"));
      }
    }
    if (!(parsed.high_freq_factor > parsed.low_freq_factor)) {
      return Bad(
          absl::StrCat(prefix, ".high_freq_factor"), object.at("high_freq_factor"),
          absl::StrCat("must be greater than low_freq_factor (", parsed.low_freq_factor, ")"));
    }
  }
  *scaling = parsed;
  return absl::OkStatus();
}

// The parse proper: `root` is a JSON object; every key is either consumed by
// a field parser, benign, or refused.
class ConfigParser {
 public:
  explicit ConfigParser(const Json& root) : root_(root) {}

  absl::StatusOr<ModelConfig> Parse() {
    ModelConfig config;
    auto status = ParseFamily(&config);
    if (!status.ok()) return status;
    status = RefuseUnknownKeys(config.family, &config);
    if (!status.ok()) return status;
    status = ParseSizes(&config);
    if (!status.ok()) return status;
    status = ParseSemantics(&config);
    if (!status.ok()) return status;
    status = ParseRope(&config);
    if (!status.ok()) return status;
    status = ParseSlidingWindow(&config);
    if (!status.ok()) return status;
    return config;
  }

 private:
  const Json* Get(absl::string_view key) const {
    auto it = root_.find(std::string(key));
    return it == root_.end() ? nullptr : &*it;
  }
  // Present and not null.
  const Json* GetValue(absl::string_view key) const {
    const Json* v = Get(key);
    return v == nullptr || v->is_null() ? nullptr : v;
  }

  absl::Status ParseFamily(ModelConfig* config) {
    const Json* type = Get("model_type");
    if (type == nullptr) return absl::InvalidArgumentError("config.json: 'model_type' is missing");
    if (type->is_string()) {
      const std::string& name = type->get_ref<const std::string&>();
      if (name == "llama") {
        config->family = ModelFamily::kLlama;
        return absl::OkStatus();
      }
      if (name == "qwen2") {
        config->family = ModelFamily::kQwen2;
        return absl::OkStatus();
      }
      if (name == "mistral") {
        config->family = ModelFamily::kMistral;
        return absl::OkStatus();
      }
      if (name == "qwen3") {
        config->family = ModelFamily::kQwen3;
        return absl::OkStatus();
      }
    }
    return Bad("model_type", *type,
               "is not supported; megatrain implements \"llama\", \"qwen2\", \"mistral\" and "
               "\"qwen3\"");
  }

  absl::Status RefuseUnknownKeys(ModelFamily family, ModelConfig* config) {
    std::set<std::string_view> known = {
        "model_type",
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "tie_word_embeddings",
        "attention_dropout",
    };
    switch (family) {
      case ModelFamily::kLlama:
        known.insert({"attention_bias", "mlp_bias", "pretraining_tp"});
        break;
      case ModelFamily::kQwen2:
        known.insert({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"});
        break;
      case ModelFamily::kMistral:
        known.insert("sliding_window");
        break;
      case ModelFamily::kQwen3:
        known.insert({"attention_bias", "use_sliding_window", "sliding_window",
                      "max_window_layers", "layer_types"});
        break;
    }
    for (const auto& [key, value] : root_.items()) {
      if (known.count(key)) continue;
      bool benign = false;
      for (std::string_view b : kBenignKeys) benign = benign || key == b;
      if (!benign) return Unsupported(key, value);
      bool source_only = false;
      for (std::string_view s : kSourceOnlyKeys) source_only = source_only || key == s;
      if (!source_only) config->passthrough[key] = value.dump();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> RequiredInt(absl::string_view key, int64_t min, int64_t max) {
    const Json* v = Get(key);
    if (v == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: '", key, "' is required"));
    }
    return AsInt(key, *v, min, max);
  }

  absl::Status ParseSizes(ModelConfig* c) {
    auto vocab = RequiredInt("vocab_size", 1, kMaxVocab);
    if (!vocab.ok()) return vocab.status();
    auto hidden = RequiredInt("hidden_size", 1, kMaxWidth);
    if (!hidden.ok()) return hidden.status();
    auto inter = RequiredInt("intermediate_size", 1, kMaxWidth);
    if (!inter.ok()) return inter.status();
    auto layers = RequiredInt("num_hidden_layers", 1, kMaxLayers);
    if (!layers.ok()) return layers.status();
    auto heads = RequiredInt("num_attention_heads", 1, kMaxHeads);
    if (!heads.ok()) return heads.status();
    auto positions = RequiredInt("max_position_embeddings", 1, kMaxPositions);
    if (!positions.ok()) return positions.status();
    c->vocab_size = *vocab;
    c->hidden_size = *hidden;
    c->intermediate_size = *inter;
    c->num_hidden_layers = static_cast<int>(*layers);
    c->num_attention_heads = static_cast<int>(*heads);
    c->max_position_embeddings = *positions;

    c->num_key_value_heads = c->num_attention_heads;
    if (const Json* kv = GetValue("num_key_value_heads")) {
      auto n = AsInt("num_key_value_heads", *kv, 1, kMaxHeads);
      if (!n.ok()) return n.status();
      if (c->num_attention_heads % *n != 0) {
        return Bad("num_key_value_heads", *kv,
                   absl::StrCat("must divide num_attention_heads (", c->num_attention_heads, ")"));
      }
      c->num_key_value_heads = static_cast<int>(*n);
    }
    if (const Json* hd = GetValue("head_dim")) {
      auto n = AsInt("head_dim", *hd, 2, kMaxWidth);
      if (!n.ok()) return n.status();
      if (*n % 2 != 0) return Bad("head_dim", *hd, "must be even (RoPE rotates pairs)");
      c->head_dim = static_cast<int>(*n);
    } else if (c->family == ModelFamily::kQwen3) {
      c->head_dim = 128;  // Qwen3Config's default, whatever hidden_size / heads is
    } else {
      if (c->hidden_size % c->num_attention_heads != 0) {
        return Bad("hidden_size", *Get("hidden_size"),
                   absl::StrCat("must be a multiple of num_attention_heads (",
                                c->num_attention_heads, ") when head_dim is not given"));
      }
      const int64_t d = c->hidden_size / c->num_attention_heads;
      if (d % 2 != 0) {
        return Bad("hidden_size", *Get("hidden_size"),
                   absl::StrCat("gives an odd head_dim ", d,
                                " = hidden_size / num_attention_heads"
                                "; RoPE needs an even head_dim"));
      }
      c->head_dim = static_cast<int>(d);
    }
    if (c->q_dim() > kMaxWidth) {
      return Bad("head_dim", c->head_dim,
                 absl::StrCat("times num_attention_heads (", c->num_attention_heads, ") exceeds ",
                              kMaxWidth));
    }
    return absl::OkStatus();
  }

  absl::Status ParseSemantics(ModelConfig* c) {
    if (const Json* act = GetValue("hidden_act")) {
      if (!act->is_string() || act->get<std::string>() != "silu") {
        return Bad("hidden_act", *act, "is not supported; megatrain implements \"silu\" only");
      }
    }
    if (const Json* eps = GetValue("rms_norm_eps")) {
      auto e = AsPositiveFinite("rms_norm_eps", *eps);
      if (!e.ok()) return e.status();
      c->rms_norm_eps = *e;
    }
    if (const Json* tie = GetValue("tie_word_embeddings")) {
      auto b = AsBool("tie_word_embeddings", *tie);
      if (!b.ok()) return b.status();
      c->tie_word_embeddings = *b;
    }
    if (const Json* dropout = GetValue("attention_dropout")) {
      if (!dropout->is_number()) return Bad("attention_dropout", *dropout, "must be a number");
      if (dropout->get<double>() != 0.0) {
        return Bad("attention_dropout", *dropout,
                   "is not supported; megatrain trains without attention dropout (must be 0)");
      }
    }
    if (const Json* tp = GetValue("pretraining_tp")) {
      if (!tp->is_number_integer() || tp->get<int64_t>() != 1) {
        return Bad("pretraining_tp", *tp,
                   "is not supported; megatrain implements pretraining_tp = 1 only");
      }
    }
    if (const Json* arch = GetValue("architectures")) {
      const absl::string_view expected = CausalLmClass(c->family);
      if (!arch->is_array() || arch->size() != 1 || !(*arch)[0].is_string() ||
          (*arch)[0].get<std::string>() != expected) {
        return Bad("architectures", *arch,
                   absl::StrCat("is not supported; expected [\"", expected, "\"]"));
      }
    }
    if (c->family == ModelFamily::kQwen2) c->qkv_bias = true;
    if (c->family == ModelFamily::kQwen3) c->qk_norm = true;
    if (const Json* bias = GetValue("attention_bias")) {
      auto b = AsBool("attention_bias", *bias);
      if (!b.ok()) return b.status();
      c->qkv_bias = c->o_bias = *b;
    }
    if (const Json* bias = GetValue("mlp_bias")) {
      auto b = AsBool("mlp_bias", *bias);
      if (!b.ok()) return b.status();
      c->mlp_bias = *b;
    }
    return absl::OkStatus();
  }

  absl::Status ParseRope(ModelConfig* c) {
    std::optional<double> theta;
    if (const Json* t = GetValue("rope_theta")) {
      auto v = AsPositiveFinite("rope_theta", *t);
      if (!v.ok()) return v.status();
      theta = *v;
    }
    const Json* scaling = GetValue("rope_scaling");
    if (scaling != nullptr) {
      auto status = ParseRopeObject("rope_scaling", *scaling, /*allow_theta=*/false,
                                    &c->rope_scaling, nullptr);
      if (!status.ok()) return status;
    }
    if (const Json* params = GetValue("rope_parameters")) {
      if (scaling != nullptr) {
        return Bad("rope_parameters", *params, "given together with rope_scaling; keep one");
      }
      std::optional<double> params_theta;
      auto status = ParseRopeObject("rope_parameters", *params, /*allow_theta=*/true,
                                    &c->rope_scaling, &params_theta);
      if (!status.ok()) return status;
      if (params_theta.has_value()) {
        if (theta.has_value() && *theta != *params_theta) {
          return Bad("rope_parameters.rope_theta", params->at("rope_theta"),
                     absl::StrCat("disagrees with rope_theta = ", *theta));
        }
        theta = params_theta;
      }
    }
    if (theta.has_value()) c->rope_theta = *theta;
    return absl::OkStatus();
  }

  absl::Status ParseSlidingWindow(ModelConfig* c) {
    if (c->family == ModelFamily::kLlama) return absl::OkStatus();
    const Json* window = Get("sliding_window");
    if (window == nullptr) {
      c->sliding_window = 4096;  // HF default for mistral, qwen2 and qwen3
    } else if (!window->is_null()) {
      auto n = AsInt("sliding_window", *window, 1, kMaxPositions);
      if (!n.ok()) return n.status();
      c->sliding_window = *n;
    }
    if (c->family == ModelFamily::kMistral) {
      c->use_sliding_window = c->sliding_window.has_value();
      return absl::OkStatus();
    }
    if (const Json* use = GetValue("use_sliding_window")) {
      auto b = AsBool("use_sliding_window", *use);
      if (!b.ok()) return b.status();
      c->use_sliding_window = *b;
    }
    if (const Json* mwl = GetValue("max_window_layers")) {
      auto n = AsInt("max_window_layers", *mwl, 0, kMaxLayers);
      if (!n.ok()) return n.status();
      c->passthrough["max_window_layers"] = mwl->dump();
    }
    if (const Json* types = GetValue("layer_types")) {
      if (!types->is_array() || types->size() != static_cast<size_t>(c->num_hidden_layers)) {
        return Bad("layer_types", *types,
                   absl::StrCat("must list one type per layer (", c->num_hidden_layers, ")"));
      }
      bool any_sliding = false;
      for (size_t i = 0; i < types->size(); ++i) {
        const Json& t = (*types)[i];
        const std::string key = absl::StrCat("layer_types[", i, "]");
        if (!t.is_string()) return Bad(key, t, "must be a string");
        const std::string& s = t.get_ref<const std::string&>();
        if (s == "sliding_attention") {
          any_sliding = true;
        } else if (s != "full_attention") {
          return Bad(key, t,
                     "is not supported; expected \"full_attention\" or \"sliding_attention\"");
        }
      }
      if (any_sliding && !c->use_sliding_window) {
        // Conservative: treat the declared sliding layers as active.
        c->use_sliding_window = true;
      }
    }
    if (c->use_sliding_window && !c->sliding_window.has_value()) {
      return Bad("sliding_window", nullptr, "must be an integer when use_sliding_window is true");
    }
    return absl::OkStatus();
  }

  const Json& root_;
};

}  // namespace

std::string_view ModelTypeName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen3:
      return "qwen3";
  }
  return "?";
}

absl::Status ModelConfig::CheckSequenceLength(int64_t seq_len) const {
  if (seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len = ", seq_len, " must be positive"));
  }
  if (use_sliding_window && sliding_window.has_value() && seq_len > *sliding_window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len = ", seq_len, " exceeds the ", std::string(ModelTypeName(family)),
        " model's sliding_window = ", *sliding_window,
        "; megatrain computes full causal attention, which equals sliding-window attention only "
        "for seq_len <= sliding_window"));
  }
  return absl::OkStatus();
}

kernels::RopeScaling ModelConfig::KernelRopeScaling() const {
  kernels::RopeScaling k;
  if (!rope_scaling.enabled) return k;  // factor 0 = no scaling
  k.factor = rope_scaling.factor;
  k.low_freq_factor = rope_scaling.low_freq_factor;
  k.high_freq_factor = rope_scaling.high_freq_factor;
  k.original_max_position_embeddings =
      static_cast<double>(rope_scaling.original_max_position_embeddings);
  return k;
}

std::string ModelConfig::ToJson() const {
  nlohmann::ordered_json j;
  j["architectures"] = {std::string(CausalLmClass(family))};
  j["model_type"] = std::string(ModelTypeName(family));
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling.enabled) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_dropout"] = 0.0;
  switch (family) {
    case ModelFamily::kLlama:
      j["attention_bias"] = qkv_bias;
      j["mlp_bias"] = mlp_bias;
      j["pretraining_tp"] = 1;
      break;
    case ModelFamily::kQwen2:
      j["use_sliding_window"] = use_sliding_window;
      j["sliding_window"] = sliding_window.has_value() ? nlohmann::ordered_json(*sliding_window)
                                                       : nlohmann::ordered_json(nullptr);
      break;
    case ModelFamily::kMistral:
      j["sliding_window"] = sliding_window.has_value() ? nlohmann::ordered_json(*sliding_window)
                                                       : nlohmann::ordered_json(nullptr);
      break;
    case ModelFamily::kQwen3:
      j["attention_bias"] = qkv_bias;
      j["use_sliding_window"] = use_sliding_window;
      j["sliding_window"] = sliding_window.has_value() ? nlohmann::ordered_json(*sliding_window)
                                                       : nlohmann::ordered_json(nullptr);
      break;
  }
  for (const auto& [key, text] : passthrough) j[key] = nlohmann::ordered_json::parse(text);
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  auto root = ParseJsonStrict(json_text, "config.json");
  if (!root.ok()) return root.status();
  if (!root->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: top level must be a JSON object, got ", Show(*root)));
  }
  return ConfigParser(*root).Parse();
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path);
  if (!text.ok()) return text.status();
  auto config = ParseModelConfig(*text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace megatrain::engine
