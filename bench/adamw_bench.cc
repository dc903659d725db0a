// adamw_bench: throughput of HostAdamw::Step (and the gradient norm) against
// the machine's STREAM-triad memory bandwidth measured in the same run.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/common/huge_pages.h"
#include "engine/common/thread_pool.h"
#include "engine/optimizer/grad_norm.h"
#include "engine/optimizer/host_adamw.h"
#include "engine/optimizer/simd_isa.h"
#include "kernels/common/adamw.h"

ABSL_FLAG(std::vector<std::string>, params,
          (std::vector<std::string>{"10000000", "100000000", "500000000"}),
          "parameter counts to benchmark (comma-separated)");
ABSL_FLAG(int, threads, 2, "optimizer and triad worker threads");
ABSL_FLAG(int, steps, 10, "timed steps per measurement (median reported)");
ABSL_FLAG(int, warmup, 2, "untimed steps before timing");
ABSL_FLAG(bool, huge_pages, true,
          "advise transparent huge pages on every benchmark array before first touch "
          "(engine/common/huge_pages.h); false leaves them on 4 KiB pages");
ABSL_FLAG(int64_t, triad_elements, 64 << 20, "doubles per triad array (3 arrays)");

namespace megatrain::engine {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using AlignedArray = std::unique_ptr<T[], FreeDeleter>;

// With huge_pages, the store's own allocation (AllocateStreamingArray: 2 MiB
// aligned and advised before the first touch, the fill in RunSize); without,
// the same alignment on 4 KiB pages.
template <typename T>
AlignedArray<T> Allocate(size_t n, bool huge_pages) {
  const size_t bytes = n * sizeof(T);
  void* p = huge_pages ? AllocateStreamingArray(bytes, 64)
                       : std::aligned_alloc(kHugePageBytes, (bytes + kHugePageBytes - 1) /
                                                                kHugePageBytes * kHugePageBytes);
  if (p == nullptr) {
    std::fprintf(stderr, "adamw_bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  return AlignedArray<T>(static_cast<T*>(p));
}

// AnonHugePages of /proc/self/smaps_rollup in MiB: how much really got huge pages.
long long AnonHugePagesMib() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "AnonHugePages: %lld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib < 0 ? -1 : kib / 1024;
}

constexpr size_t kTaskElements = 64 * 1024;

size_t Tasks(size_t n) { return (n + kTaskElements - 1) / kTaskElements; }

// Runs fn(begin, end) over [0, n) in fixed pieces on the pool.
template <typename Fn>
void ForRanges(ThreadPool& pool, size_t n, Fn fn) {
  pool.ParallelFor(Tasks(n), [&](size_t t) {
    const size_t begin = t * kTaskElements;
    fn(begin, std::min(n, begin + kTaskElements));
  });
}

// Step times of one measured operation: wall clock, and the CPU time of the
// whole process (all threads) over the same interval. On a shared machine the
// wall time mostly measures the CPU share we got; CPU time per step does not.
struct Timing {
  std::vector<double> seconds;
  std::vector<double> cpu_seconds;
  static double MedianOf(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }
  double Median() const { return MedianOf(seconds); }
  double CpuMedian() const { return MedianOf(cpu_seconds); }
  double Best() const { return *std::min_element(seconds.begin(), seconds.end()); }
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Runs the operations round-robin, one step of each per round, so that all
// of them sample the same background load (the machine is shared).
std::vector<Timing> TimeInterleaved(int warmup, int steps,
                                    const std::vector<std::function<void()>>& ops) {
  std::vector<Timing> timings(ops.size());
  for (int round = 0; round < warmup + steps; ++round) {
    for (size_t k = 0; k < ops.size(); ++k) {
      const double cpu_start = ProcessCpuSeconds();
      const auto start = std::chrono::steady_clock::now();
      ops[k]();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
      if (round >= warmup) {
        timings[k].seconds.push_back(seconds);
        timings[k].cpu_seconds.push_back(cpu_seconds);
      }
    }
  }
  return timings;
}

// a[i] = b[i] + s * c[i] with AVX2 (the build's baseline), normal or
// non-temporal stores.
void Triad(double* a, const double* b, const double* c, double s, size_t begin, size_t end,
           bool streaming) {
  const __m256d sv = _mm256_set1_pd(s);
  size_t i = begin;
  for (; i + 4 <= end; i += 4) {
    const __m256d r =
        _mm256_add_pd(_mm256_loadu_pd(b + i), _mm256_mul_pd(sv, _mm256_loadu_pd(c + i)));
    if (streaming) {
      _mm256_stream_pd(a + i, r);
    } else {
      _mm256_storeu_pd(a + i, r);
    }
  }
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
  if (streaming) _mm_sfence();
}

// Prints one measurement; returns its GB/s. reference_gbps > 0 adds the ratio.
double PrintRow(const char* name, size_t n, double bytes_per_elem, const Timing& t,
                double reference_gbps) {
  const double gbps = bytes_per_elem * n / t.Median() / 1e9;
  std::printf("%-11s n=%-9zu median %8.2f ms (best %8.2f)  %6.3f G/s  %2.0f B/elem  %6.2f GB/s",
              name, n, t.Median() * 1e3, t.Best() * 1e3, n / t.Median() / 1e9, bytes_per_elem,
              gbps);
  if (reference_gbps > 0.0) {
    std::printf("  = %3.0f%% of triad", 100.0 * gbps / reference_gbps);
  }
  std::printf("\n");
  return gbps;
}

void RunSize(ThreadPool& pool, size_t n, int warmup, int steps, size_t triad_n, bool huge) {
  AlignedArray<double> a = Allocate<double>(triad_n, huge), b = Allocate<double>(triad_n, huge),
                       c = Allocate<double>(triad_n, huge);
  AlignedArray<float> p = Allocate<float>(n, huge), m = Allocate<float>(n, huge),
                      v = Allocate<float>(n, huge), g = Allocate<float>(n, huge);
  AlignedArray<uint16_t> bf16 = Allocate<uint16_t>(n, huge);
  ForRanges(pool, triad_n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      a[i] = 0.0;
      b[i] = 1.0;
      c[i] = 2.0;
    }
  });
  ForRanges(pool, n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      p[i] = 0.01f * static_cast<float>(i % 1013) - 5.0f;
      m[i] = 0.0f;
      v[i] = 0.0f;
      g[i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;
      bf16[i] = 0;
    }
  });
  std::printf("n=%zu: %lld MiB of the process on transparent huge pages\n", n, AnonHugePagesMib());
  HostAdamw adamw(&pool);
  // One packed "layer": a decayed matrix and a small undecayed norm at the end.
  const size_t norm = std::min<size_t>(n, 4096);
  const std::vector<AdamwSegment> segments = {{0, n - norm, true}, {n - norm, norm, false}};
  long long step = 0;
  auto run = [&](uint16_t* copy) {
    ++step;
    adamw.Step(kernels::MakeAdamwStepScalars(1e-4, 0.9, 0.95, 1e-8, 0.1, step, 0.5),
               kernels::MakeAdamwStepScalars(1e-4, 0.9, 0.95, 1e-8, 0.0, step, 0.5), segments,
               p.get(), m.get(), v.get(), g.get(), copy);
  };
  auto triad = [&](bool streaming) {
    ForRanges(pool, triad_n, [&](size_t lo, size_t hi) {
      Triad(a.get(), b.get(), c.get(), 3.0, lo, hi, streaming);
    });
  };
  double sink = 0.0;
  const std::vector<Timing> t = TimeInterleaved(
      warmup, steps,
      {[&] { triad(false); }, [&] { triad(true); }, [&] { run(nullptr); }, [&] { run(bf16.get()); },
       [&] {
         sink += GradSumOfSquares({g.get(), n}, &pool);
       }});
  // Triad counts 3 arrays (24 B/elem, STREAM convention; the ratio uses
  // this); with ordinary stores the write-allocate read of a moves 8 B more,
  // shown as triad(+wa).
  // AdamW: read p, m, v, g (16) + write p, m, v (12) = 28 B/param; the bf16
  // copy adds 2 (non-temporal stores, so no write-allocate). The norm reads g.
  const double triad_gbps = PrintRow("triad", triad_n, 24.0, t[0], 0.0);
  PrintRow("triad(+wa)", triad_n, 32.0, t[0], 0.0);
  PrintRow("triad(nt)", triad_n, 24.0, t[1], 0.0);
  PrintRow("adamw", n, 28.0, t[2], triad_gbps);
  std::printf("cpu(adamw)  n=%-9zu median %8.2f ms of process CPU time per step (all threads)\n", n,
              t[2].CpuMedian() * 1e3);
  PrintRow("adamw+bf16", n, 30.0, t[3], triad_gbps);
  PrintRow("grad_norm", n, 4.0, t[4], triad_gbps);
  if (!(sink > 0.0)) std::printf("(unexpected gradient norm %g)\n", sink);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (threads < 1 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "adamw_bench: need --threads >= 1, --steps >= 1, --warmup >= 0\n");
    return 2;
  }
  ThreadPool pool(static_cast<size_t>(threads));
  const bool huge_pages = absl::GetFlag(FLAGS_huge_pages);
  std::printf("adamw_bench: threads=%d steps=%d (median) warmup=%d isa=%s huge_pages=%s\n", threads,
              steps, warmup, std::string(SimdIsaName(BestSupportedSimdIsa())).c_str(),
              huge_pages ? "advised" : "off");
  const size_t triad_n = static_cast<size_t>(absl::GetFlag(FLAGS_triad_elements));
  std::printf(
      "triad: a[i] = b[i] + s*c[i], %zu doubles x 3 arrays (%.1f GiB), 2 variants: "
      "ordinary and non-temporal (nt) stores\n",
      triad_n, 24.0 * triad_n / (1 << 30));
  for (const std::string& text : absl::GetFlag(FLAGS_params)) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || n == 0) {
      std::fprintf(stderr, "adamw_bench: bad --params entry '%s'\n", text.c_str());
      return 2;
    }
    RunSize(pool, n, warmup, steps, triad_n, huge_pages);
  }
  return 0;
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) { return megatrain::engine::Main(argc, argv); }
