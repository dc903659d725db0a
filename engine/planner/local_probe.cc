// Timings of sgemm, memcpy and HostAdamw on this machine (medians of a few repetitions).
#include "engine/planner/local_probe.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/thread_pool.h"
#include "engine/optimizer/host_adamw.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine::planner {
namespace {

template <typename Fn>
double MedianSeconds(int reps, Fn&& fn) {
  std::vector<double> t;
  fn();  // warm-up: page faults, thread start-up
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

absl::StatusOr<HardwareProfile> ProbeLocalCpu(const ProbeOptions& o) {
  if (o.blas_threads < 1 || o.optimizer_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("blas_threads=", o.blas_threads,
                                                   ", optimizer_threads=", o.optimizer_threads,
                                                   ": both must be >= 1"));
  }
  if (o.gemm_m < 1 || o.gemm_n < 1 || o.gemm_k < 1) {
    return absl::InvalidArgumentError("gemm probe shape must be positive");
  }
  HardwareProfile p;
  p.name = "local";
  p.cpu_device = true;
  p.device_memory_bytes = o.arena_bytes;
  p.weight_bytes = 4;
  p.activation_bytes = 4;
  p.grad_bytes = 4;
  p.compute_efficiency = o.compute_efficiency;

  openblas_set_num_threads(o.blas_threads);
  const size_t m = o.gemm_m, n = o.gemm_n, k = o.gemm_k;
  std::vector<float> a(m * k, 0.01f), b(n * k, 0.02f), c(m * n);
  // y = x W^T as in the layer math.
  const double gemm_s = MedianSeconds(5, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), b.data(),
                static_cast<int>(k), 0.0f, c.data(), static_cast<int>(n));
  });
  p.dense_tflops = 2.0 * m * n * k / gemm_s / 1e12;

  std::vector<char> src(o.memcpy_bytes, 1), dst(o.memcpy_bytes, 0);
  const double copy_s =
      MedianSeconds(5, [&] { std::memcpy(dst.data(), src.data(), o.memcpy_bytes); });
  p.memcpy_gbps = static_cast<double>(o.memcpy_bytes) / copy_s / 1e9;
  // A copy reads and writes: the memory traffic is twice the bytes copied.
  p.host_memory_gbps = 2 * p.memcpy_gbps;
  p.device_memory_gbps = p.host_memory_gbps;
  p.h2d_gbps = o.link_gbps;
  p.d2h_gbps = o.link_gbps;
  p.link_latency_us = o.link_latency_us;

  ThreadPool pool(static_cast<size_t>(o.optimizer_threads));
  HostAdamw adamw(&pool);
  const size_t e = o.adamw_elements;
  std::vector<float> param(e, 0.1f), mom(e, 0.0f), var(e, 0.0f), grad(e, 0.001f);
  const AdamwSegment segment{0, e, true};
  const auto scalars = kernels::MakeAdamwStepScalars(1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0);
  const double adamw_s = MedianSeconds(3, [&] {
    adamw.Step(scalars, scalars, absl::MakeConstSpan(&segment, 1), param.data(), mom.data(),
               var.data(), grad.data(), nullptr);
  });
  p.adamw_params_per_second = static_cast<double>(e) / adamw_s;
  p.nvme_read_gbps = o.nvme_read_gbps;
  p.nvme_write_gbps = o.nvme_write_gbps;
  p.description = absl::StrCat("this machine as the CPU device: sgemm ", p.dense_tflops * 1e3,
                               " GFLOP/s (", o.blas_threads, " threads), memcpy ", p.memcpy_gbps,
                               " GB/s, AdamW ", p.adamw_params_per_second / 1e6, " M params/s");
  return p;
}

}  // namespace megatrain::engine::planner
