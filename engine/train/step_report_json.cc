// Owns the JSON codec of StepReport and TrainingRunResult (see step_report_json.h).
#include "engine/train/step_report_json.h"

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace megatrain::engine {
namespace {

using Json = nlohmann::json;

// Matches T and const T, so that one field list serves the writer and the reader.
template <typename T, typename U>
concept Is = std::same_as<std::remove_const_t<T>, U>;

template <typename T>
concept Integer = std::integral<T> && !std::same_as<T, bool>;

template <typename T>
inline constexpr bool kIsVector = false;
template <typename T>
inline constexpr bool kIsVector<std::vector<T>> = true;

// One field list per struct, walked in both directions, so that a field added to the struct and
// here cannot be written without being read back.
void ForEachField(Is<LayerTiming> auto& t, auto&& field) {
  field("copy_in_seconds", t.copy_in_seconds);
  field("compute_seconds", t.compute_seconds);
  field("copy_out_seconds", t.copy_out_seconds);
  field("stall_seconds", t.stall_seconds);
  field("optimizer_seconds", t.optimizer_seconds);
}

void ForEachField(Is<ActivationBlockReport> auto& b, auto&& field) {
  field("first_layer", b.first_layer);
  field("num_layers", b.num_layers);
  field("mode", b.mode);
  field("reason", b.reason);
}

void ForEachField(Is<DeviceStepFigures> auto& d, auto&& field) {
  field("stall_seconds", d.stall_seconds);
  field("copy_in_seconds", d.copy_in_seconds);
  field("compute_seconds", d.compute_seconds);
  field("turn_wait_seconds", d.turn_wait_seconds);
  field("reduce_seconds", d.reduce_seconds);
  field("link_bytes", d.link_bytes);
  field("micro_batches", d.micro_batches);
}

void ForEachField(Is<StepReport> auto& r, auto&& field) {
  field("step", r.step);
  field("loss", r.loss);
  field("valid_tokens", r.valid_tokens);
  field("tokens", r.tokens);
  field("grad_norm", r.grad_norm);
  field("clip_coefficient", r.clip_coefficient);
  field("learning_rate", r.learning_rate);
  field("skipped", r.skipped);
  field("speculated_entries", r.speculated_entries);
  field("speculation_committed", r.speculation_committed);
  field("speculation_seconds", r.speculation_seconds);
  field("no_counted_targets", r.no_counted_targets);
  field("skipped_total", r.skipped_total);
  field("step_seconds", r.step_seconds);
  field("tokens_per_second", r.tokens_per_second);
  field("previous_update_wait_seconds", r.previous_update_wait_seconds);
  field("layers", r.layers);
  field("total_stall_seconds", r.total_stall_seconds);
  field("total_copy_in_seconds", r.total_copy_in_seconds);
  field("device_arena_peak_bytes", r.device_arena_peak_bytes);
  field("device_arena_bytes", r.device_arena_bytes);
  field("pinned_host_bytes", r.pinned_host_bytes);
  field("pageable_host_bytes", r.pageable_host_bytes);
  field("optimizer_seconds", r.optimizer_seconds);
  field("nvme_bytes_read", r.nvme_bytes_read);
  field("nvme_bytes_written", r.nvme_bytes_written);
  field("nvme_wait_seconds", r.nvme_wait_seconds);
  field("communication_seconds", r.communication_seconds);
  field("communication_bytes", r.communication_bytes);
  field("activation_blocks", r.activation_blocks);
  field("devices", r.devices);
}

void ForEachField(Is<TrainingRunResult> auto& r, auto&& field) {
  field("unigram_entropy_nats", r.unigram_entropy_nats);
  field("initial_validation_loss", r.initial_validation_loss);
  field("final_validation_loss", r.final_validation_loss);
  field("final_train_loss", r.final_train_loss);
  field("tokens_per_second", r.tokens_per_second);
  field("resumed_from_step", r.resumed_from_step);
  field("last_checkpoint", r.last_checkpoint);
  field("parameters", r.parameters);
  field("steps_run", r.steps_run);
  field("speculations_committed", r.speculations_committed);
  field("speculations_discarded", r.speculations_discarded);
}

// JSON numbers cannot hold NaN or infinities, and a skipped step's loss or norm can be one.
Json EncodeDouble(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

template <typename T>
Json Encode(const T& value) {
  if constexpr (std::same_as<T, double>) {
    return EncodeDouble(value);
  } else if constexpr (Integer<T> || std::same_as<T, bool> || std::same_as<T, std::string>) {
    return value;
  } else if constexpr (kIsVector<T>) {
    Json array = Json::array();
    for (const auto& element : value) array.push_back(Encode(element));
    return array;
  } else {
    Json object = Json::object();
    ForEachField(value, [&](const char* key, const auto& field) { object[key] = Encode(field); });
    return object;
  }
}

absl::Status NotA(const std::string& path, const char* kind) {
  return absl::InvalidArgumentError(
      absl::StrCat(path.empty() ? "the value" : absl::StrCat("'", path, "'"), " is not ", kind));
}

absl::Status DecodeDouble(const Json& json, const std::string& path, double& out) {
  if (json.is_number()) {
    out = json.get<double>();
    return absl::OkStatus();
  }
  if (json.is_string()) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    static constexpr std::pair<const char*, double> kNonFinite[] = {
        {"nan", std::numeric_limits<double>::quiet_NaN()}, {"inf", kInf}, {"-inf", -kInf}};
    for (const auto& [text, number] : kNonFinite) {
      if (json.get_ref<const std::string&>() == text) {
        out = number;
        return absl::OkStatus();
      }
    }
  }
  return NotA(path, "a number");
}

template <Integer T>
absl::Status DecodeInteger(const Json& json, const std::string& path, T& out) {
  // nlohmann keeps non-negative integers as unsigned (the only kind that holds a uint64 above
  // INT64_MAX) and negative ones as signed; either must fit T exactly.
  if (json.is_number_unsigned() && std::in_range<T>(json.get<uint64_t>())) {
    out = static_cast<T>(json.get<uint64_t>());
    return absl::OkStatus();
  }
  if (json.is_number_integer() && !json.is_number_unsigned() &&
      std::in_range<T>(json.get<int64_t>())) {
    out = static_cast<T>(json.get<int64_t>());
    return absl::OkStatus();
  }
  return NotA(path, "an integer in range");
}

template <typename T>
absl::Status Decode(const Json& json, const std::string& path, T& out) {
  if constexpr (std::same_as<T, double>) {
    return DecodeDouble(json, path, out);
  } else if constexpr (Integer<T>) {
    return DecodeInteger(json, path, out);
  } else if constexpr (std::same_as<T, bool>) {
    if (!json.is_boolean()) return NotA(path, "a boolean");
    out = json.get<bool>();
    return absl::OkStatus();
  } else if constexpr (std::same_as<T, std::string>) {
    if (!json.is_string()) return NotA(path, "a string");
    out = json.get<std::string>();
    return absl::OkStatus();
  } else if constexpr (kIsVector<T>) {
    if (!json.is_array()) return NotA(path, "an array");
    out.assign(json.size(), typename T::value_type{});
    for (size_t i = 0; i < json.size(); ++i) {
      MT_RETURN_IF_ERROR(Decode(json[i], absl::StrCat(path, "[", i, "]"), out[i]));
    }
    return absl::OkStatus();
  } else {
    if (!json.is_object()) return NotA(path, "an object");
    absl::Status status;
    ForEachField(out, [&](const char* key, auto& field) {
      const auto it = json.find(key);
      if (!status.ok() || it == json.end()) return;  // absent: an older writer, keep the default
      status = Decode(*it, path.empty() ? std::string(key) : absl::StrCat(path, ".", key), field);
    });
    return status;
  }
}

template <typename T>
absl::StatusOr<T> DecodeTop(const Json& value, const char* what) {
  T out;
  if (const absl::Status status = Decode(value, "", out); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", std::string(status.message())));
  }
  return out;
}

}  // namespace

nlohmann::json StepReportToJson(const StepReport& report) { return Encode(report); }

absl::StatusOr<StepReport> StepReportFromJson(const nlohmann::json& value) {
  return DecodeTop<StepReport>(value, "step report");
}

nlohmann::json TrainingRunResultToJson(const TrainingRunResult& result) { return Encode(result); }

absl::StatusOr<TrainingRunResult> TrainingRunResultFromJson(const nlohmann::json& value) {
  return DecodeTop<TrainingRunResult>(value, "run result");
}

nlohmann::json NumberToJson(double value) { return Encode(value); }

absl::StatusOr<double> NumberFromJson(const nlohmann::json& value) {
  return DecodeTop<double>(value, "number");
}

}  // namespace megatrain::engine
