// planner_accuracy: runs every standard case on the CPU device and prints predicted vs measured
// step time, arena peak and VmHWM growth; the first case calibrates the compute efficiency of
// the local probe (docs/planning.md). Exits 1 if a non-calibration case is off by > 20%.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/planner/local_probe.h"
#include "engine/tiers/direct_io_directory.h"
#include "tests/planner/accuracy_case.h"

ABSL_FLAG(int, warmup, 2, "unmeasured steps per case");
ABSL_FLAG(int, steps, 5, "measured steps per case (median)");
ABSL_FLAG(std::string, nvme_dir, "/var/tmp/megatrain_planner_accuracy", "O_DIRECT directory");
ABSL_FLAG(double, nvme_read_gbps, 2.0, "NVMe read GB/s of nvme_dir (bench/nvme)");
ABSL_FLAG(double, nvme_write_gbps, 2.5, "NVMe write GB/s of nvme_dir (bench/nvme)");
ABSL_FLAG(double, tolerance, 0.20, "allowed relative step-time error");
ABSL_FLAG(int, only, -1, "run only this case index (VmHWM is per process: one case per run)");

namespace megatrain::engine::planner {
namespace {

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_nvme_dir);
  std::filesystem::create_directories(dir);
  const bool nvme_ok = tiers::CheckDirectIoDirectory(dir).ok();
  ProbeOptions po;
  po.nvme_read_gbps = absl::GetFlag(FLAGS_nvme_read_gbps);
  po.nvme_write_gbps = absl::GetFlag(FLAGS_nvme_write_gbps);
  absl::StatusOr<HardwareProfile> local = ProbeLocalCpu(po);
  if (!local.ok()) return 2;
  printf("%s\n", local->description.c_str());
  local->compute_efficiency = 1.0;
  const std::vector<AccuracyCase> cases = StandardCases();
  int bad = 0, checked = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const AccuracyCase& c = cases[i];
    if (absl::GetFlag(FLAGS_only) >= 0 && static_cast<int>(i) != absl::GetFlag(FLAGS_only) &&
        i != 0) {
      continue;
    }
    if (c.nvme && !nvme_ok) {
      printf("%-44s skipped: %s is not an O_DIRECT directory\n", c.name.c_str(), dir.c_str());
      continue;
    }
    // Probe again beside every case: on a shared machine the rates drift with the load.
    const double efficiency = local->compute_efficiency;
    local = ProbeLocalCpu(po);
    if (!local.ok()) return 2;
    local->compute_efficiency = efficiency;
    absl::StatusOr<Measured> m =
        RunCase(c, absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_steps), dir);
    if (!m.ok()) {
      printf("%-44s failed: %s\n", c.name.c_str(), std::string(m.status().message()).c_str());
      ++bad;
      continue;
    }
    if (i == 0) {
      // Fit the efficiency so the calibration case is predicted exactly (bisection: the
      // predicted time falls monotonically with the efficiency).
      double lo = 0.02, hi = 2.0;
      for (int it = 0; it < 40; ++it) {
        local->compute_efficiency = 0.5 * (lo + hi);
        const double t = PredictCase(c, *local, dir)->time.step_seconds;
        (t > m->step_seconds ? lo : hi) = local->compute_efficiency;
      }
      printf("calibrated compute_efficiency = %.3f\n", local->compute_efficiency);
    }
    absl::StatusOr<PlanResult> p = PredictCase(c, *local, dir);
    if (!p.ok()) return 2;
    const double err = p->time.step_seconds / m->step_seconds - 1;
    const double arena_err =
        static_cast<double>(p->device_arena_peak) / static_cast<double>(m->arena_peak) - 1;
    const double hwm_err =
        static_cast<double>(p->host_peak_bytes) / static_cast<double>(m->vmhwm_growth) - 1;
    printf("%-44s step %.4f s pred %.4f s (%+5.1f%%) [%s]  arena %+.2f%%", c.name.c_str(),
           m->step_seconds, p->time.step_seconds, 100 * err, p->time.bottleneck.c_str(),
           100 * arena_err);
    // VmHWM is a high-water mark of the whole process: only the first case of a
    // run measures its own growth (run one case per process with --only).
    if (absl::GetFlag(FLAGS_only) >= 0) {
      printf("  VmHWM %.1f MB pred %.1f MB (%+5.1f%%)", m->vmhwm_growth / 1e6,
             p->host_peak_bytes / 1e6, 100 * hwm_err);
    }
    printf("\n");
    if (i > 0) {
      ++checked;
      if (std::fabs(err) > absl::GetFlag(FLAGS_tolerance)) ++bad;
    }
  }
  printf("%d of %d validation cases within %.0f%%\n", checked - bad, checked,
         100 * absl::GetFlag(FLAGS_tolerance));
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace megatrain::engine::planner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::engine::planner::Run();
}
