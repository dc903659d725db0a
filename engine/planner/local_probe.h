// Probe of the local machine as the CPU device: OpenBLAS sgemm rate at the run's thread count,
// memcpy and memory bandwidth, HostAdamw parameters/s, and the emulated link from options.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/planner/hardware_profile.h"

namespace megatrain::engine::planner {

struct ProbeOptions {
  int blas_threads = 2;       // as the run will use (OpenBLAS rates depend on it)
  int optimizer_threads = 2;  // HostAdamw pool size
  double link_gbps = 0;       // the CPU device's emulated link; 0 = unthrottled
  double link_latency_us = 0;
  uint64_t arena_bytes = uint64_t{1} << 30;  // the CPU device's "device memory"
  // GEMM probe shape [m, k] x [k, n]: the token count and width of a representative layer.
  int gemm_m = 256, gemm_n = 1376, gemm_k = 512;
  size_t memcpy_bytes = size_t{32} << 20;
  size_t adamw_elements = size_t{4} << 20;
  double nvme_read_gbps = 0;  // not probed (bench/nvme measures the disk); 0 = no NVMe
  double nvme_write_gbps = 0;
  // Fitted on one calibration run (docs/planning.md): achieved / probed rate of the layer
  // math, which includes the attention tiles and the smaller GEMMs of the backward.
  double compute_efficiency = 1.0;
};

absl::StatusOr<HardwareProfile> ProbeLocalCpu(const ProbeOptions& options);

}  // namespace megatrain::engine::planner
