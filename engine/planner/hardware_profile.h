// HardwareProfile: what the planner needs to know about a machine (device memory, compute rate,
// host link, host memory and optimizer speed, NVMe), with the built-in table and user files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::engine::planner {

// Units: bytes, TFLOP/s (1e12 FLOP/s), GB/s (1e9 bytes/s, each link direction), parameters/s.
struct HardwareProfile {
  std::string name;
  std::string description;
  // The CPU device: compute, copies and the host optimizer share the host cores, so the
  // optimizer's CPU time adds to the step instead of hiding behind the next forward.
  bool cpu_device = false;
  uint64_t device_memory_bytes = 0;
  double dense_tflops = 0;          // bf16 dense peak (GPU) or measured fp32 sgemm (CPU device)
  double compute_efficiency = 0.6;  // achieved / dense_tflops on the layer GEMMs and attention
  double device_memory_gbps = 0;    // element-wise ops (norms, RoPE, SwiGLU, zeroing)
  double h2d_gbps = 0;              // 0 = unthrottled (CPU device: memcpy speed)
  double d2h_gbps = 0;
  double link_latency_us = 0;
  double memcpy_gbps = 0;              // CPU device: speed of the copy itself (0 = h2d_gbps)
  double host_memory_gbps = 0;         // host optimizer's streams, gradient norm, accumulation
  double adamw_params_per_second = 0;  // 0 = host_memory_gbps * 0.5 / 28 bytes per parameter
  double nvme_read_gbps = 0;
  double nvme_write_gbps = 0;
  // Data parallelism (data_parallel.h); 0 = not given, and plans of more devices are refused.
  double peer_gbps = 0;     // device to device in one node, each direction (NVLink or PCIe)
  double network_gbps = 0;  // node to node, each direction, per node (e.g. one 400 Gb/s HCA = 50)
  int weight_bytes = 2;      // bytes per streamed weight (bf16 compute copy; 4 on the CPU device)
  int activation_bytes = 2;  // bytes per activation element on the device (4 on the CPU device)
  int grad_bytes = 4;        // bytes per gradient element copied out (fp32 slabs)

  double AdamwParamsPerSecond() const;
};

// Parses {"profiles": [{"name": ..., field: value, ...}, ...]}; unknown fields and missing or
// non-positive required values are INVALID_ARGUMENT naming the profile and field.
absl::StatusOr<std::vector<HardwareProfile>> ParseHardwareProfiles(std::string_view json_text);

// The table of engine/planner/hardware_profiles.json, compiled in.
std::vector<HardwareProfile> BuiltinHardwareProfiles();

// Reads a user file and lays its profiles over `base` (same name = replaced, new = appended).
absl::StatusOr<std::vector<HardwareProfile>> ExtendHardwareProfiles(
    std::vector<HardwareProfile> base, const std::string& path);

// NOT_FOUND listing the known names.
absl::StatusOr<HardwareProfile> FindHardwareProfile(const std::vector<HardwareProfile>& profiles,
                                                    std::string_view name);

}  // namespace megatrain::engine::planner
