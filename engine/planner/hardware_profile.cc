// Parsing of hardware profiles and the compiled-in table.
#include "engine/planner/hardware_profile.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/safe_files.h"
#include "engine/common/fatal.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine::planner {
namespace {

constexpr char kBuiltinJson[] =
#include "engine/planner/hardware_profiles.json.inc"
    ;

absl::StatusOr<HardwareProfile> ProfileFromJson(const nlohmann::json& j, size_t index) {
  HardwareProfile p;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("profiles[", index, "] is not an object"));
  }
  if (!j.contains("name") || !j["name"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("profiles[", index, "].name is missing"));
  }
  p.name = j["name"].get<std::string>();
  const std::string where = absl::StrCat("profile '", p.name, "': ");
  struct Field {
    const char* key;
    double* value;
    bool required;
  };
  double device_memory = 0, weight_bytes = 2, activation_bytes = 2, grad_bytes = 4;
  const Field fields[] = {
      {"device_memory_bytes", &device_memory, true},
      {"dense_tflops", &p.dense_tflops, true},
      {"compute_efficiency", &p.compute_efficiency, false},
      {"device_memory_gbps", &p.device_memory_gbps, true},
      {"h2d_gbps", &p.h2d_gbps, true},
      {"d2h_gbps", &p.d2h_gbps, true},
      {"link_latency_us", &p.link_latency_us, false},
      {"memcpy_gbps", &p.memcpy_gbps, false},
      {"host_memory_gbps", &p.host_memory_gbps, true},
      {"adamw_params_per_second", &p.adamw_params_per_second, false},
      {"nvme_read_gbps", &p.nvme_read_gbps, false},
      {"nvme_write_gbps", &p.nvme_write_gbps, false},
      {"peer_gbps", &p.peer_gbps, false},
      {"network_gbps", &p.network_gbps, false},
      {"weight_bytes", &weight_bytes, false},
      {"activation_bytes", &activation_bytes, false},
      {"grad_bytes", &grad_bytes, false},
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "name") continue;
    if (key == "description") {
      if (!it->is_string()) return absl::InvalidArgumentError(where + "description must be text");
      p.description = it->get<std::string>();
      continue;
    }
    if (key == "cpu_device") {
      if (!it->is_boolean()) return absl::InvalidArgumentError(where + "cpu_device must be bool");
      p.cpu_device = it->get<bool>();
      continue;
    }
    const Field* field = nullptr;
    for (const Field& f : fields) {
      if (key == f.key) field = &f;
    }
    if (field == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown field ", key));
    if (!it->is_number() || it->get<double>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, key, "=", it->dump(), " must be a non-negative number"));
    }
    *field->value = it->get<double>();
  }
  for (const Field& f : fields) {
    if (f.required && !(*f.value > 0) && std::string_view(f.key) != "h2d_gbps" &&
        std::string_view(f.key) != "d2h_gbps") {
      return absl::InvalidArgumentError(absl::StrCat(where, f.key, " must be given and > 0"));
    }
  }
  if (!(p.compute_efficiency > 0 && p.compute_efficiency <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "compute_efficiency=", p.compute_efficiency, " must be in (0, 1]"));
  }
  p.device_memory_bytes = static_cast<uint64_t>(device_memory);
  p.weight_bytes = static_cast<int>(weight_bytes);
  p.activation_bytes = static_cast<int>(activation_bytes);
  p.grad_bytes = static_cast<int>(grad_bytes);
  return p;
}

}  // namespace

double HardwareProfile::AdamwParamsPerSecond() const {
  if (adamw_params_per_second > 0) return adamw_params_per_second;
  return host_memory_gbps * 1e9 * 0.5 / 28.0;
}

absl::StatusOr<std::vector<HardwareProfile>> ParseHardwareProfiles(std::string_view json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("hardware profiles: not valid JSON");
  if (!j.is_object() || !j.contains("profiles") || !j["profiles"].is_array()) {
    return absl::InvalidArgumentError("hardware profiles: expected {\"profiles\": [...]}");
  }
  std::vector<HardwareProfile> out;
  for (size_t i = 0; i < j["profiles"].size(); ++i) {
    absl::StatusOr<HardwareProfile> p = ProfileFromJson(j["profiles"][i], i);
    if (!p.ok()) return p.status();
    out.push_back(std::move(*p));
  }
  return out;
}

std::vector<HardwareProfile> BuiltinHardwareProfiles() {
  absl::StatusOr<std::vector<HardwareProfile>> p = ParseHardwareProfiles(kBuiltinJson);
  // The built-in table is checked by hardware_profile_test; a broken one is a build defect.
  if (!p.ok()) {
    internal::DieBecause(
        absl::StrCat("the built-in hardware profiles do not parse: ", p.status().ToString()));
  }
  return *std::move(p);
}

absl::StatusOr<std::vector<HardwareProfile>> ExtendHardwareProfiles(
    std::vector<HardwareProfile> base, const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("hardware profiles: ", text.status().message()));
  }
  absl::StatusOr<std::vector<HardwareProfile>> extra = ParseHardwareProfiles(*text);
  if (!extra.ok()) {
    return absl::Status(extra.status().code(), absl::StrCat(path, ": ", extra.status().message()));
  }
  for (HardwareProfile& p : *extra) {
    bool replaced = false;
    for (HardwareProfile& b : base) {
      if (b.name == p.name) {
        b = p;
        replaced = true;
      }
    }
    if (!replaced) base.push_back(std::move(p));
  }
  return base;
}

absl::StatusOr<HardwareProfile> FindHardwareProfile(const std::vector<HardwareProfile>& profiles,
                                                    std::string_view name) {
  std::vector<std::string> names;
  for (const HardwareProfile& p : profiles) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(absl::StrCat("no hardware profile named '", std::string(name),
                                          "'; known: ", absl::StrJoin(names, ", "), ", local"));
}

}  // namespace megatrain::engine::planner
