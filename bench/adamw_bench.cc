// adamw_bench: throughput of HostAdamw::Step (and the gradient norm) against
// the machine's STREAM-triad memory bandwidth measured in the same run.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
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
ABSL_FLAG(int64_t, triad_elements, 64 << 20, "doubles per triad array (3 arrays)");

namespace megatrain::engine {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using AlignedArray = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
AlignedArray<T> Allocate(size_t n) {
  const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  T* p = static_cast<T*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) {
    std::fprintf(stderr, "adamw_bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  return AlignedArray<T>(p);
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

template <typename Fn>
double MedianSeconds(int warmup, int steps, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> seconds;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
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

struct TriadResult {
  double gbps_3_arrays;       // STREAM convention: 24 bytes per element
  double gbps_with_allocate;  // plus the write-allocate read of a: 32 bytes
  double gbps_streaming;      // non-temporal stores: 24 bytes really move
};

TriadResult MeasureTriad(ThreadPool& pool, size_t n, int warmup, int steps) {
  AlignedArray<double> a = Allocate<double>(n), b = Allocate<double>(n), c = Allocate<double>(n);
  ForRanges(pool, n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      a[i] = 0.0;
      b[i] = 1.0;
      c[i] = 2.0;
    }
  });
  const double normal = MedianSeconds(warmup, steps, [&] {
    ForRanges(pool, n,
              [&](size_t lo, size_t hi) { Triad(a.get(), b.get(), c.get(), 3.0, lo, hi, false); });
  });
  const double streaming = MedianSeconds(warmup, steps, [&] {
    ForRanges(pool, n,
              [&](size_t lo, size_t hi) { Triad(a.get(), b.get(), c.get(), 3.0, lo, hi, true); });
  });
  return {24.0 * n / normal / 1e9, 32.0 * n / normal / 1e9, 24.0 * n / streaming / 1e9};
}

struct AdamwResult {
  double params_per_second;
  double gbps;
};

void PrintTriad(size_t n, const TriadResult& triad) {
  std::printf(
      "triad       %zu doubles x 3 (%.1f GiB): %.2f GB/s counting 3 arrays (24 B/elem, STREAM "
      "convention), %.2f GB/s counting write-allocate (32 B/elem); streaming stores %.2f GB/s\n",
      n, 24.0 * n / (1 << 30), triad.gbps_3_arrays, triad.gbps_with_allocate, triad.gbps_streaming);
}

void RunSize(ThreadPool& pool, size_t n, int warmup, int steps, size_t triad_n) {
  // Triad first, in its own scope, so its arrays are freed before ours.
  const TriadResult triad = MeasureTriad(pool, triad_n, warmup, steps);
  PrintTriad(triad_n, triad);
  AlignedArray<float> p = Allocate<float>(n), m = Allocate<float>(n), v = Allocate<float>(n),
                      g = Allocate<float>(n);
  AlignedArray<uint16_t> bf16 = Allocate<uint16_t>(n);
  ForRanges(pool, n, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      p[i] = 0.01f * static_cast<float>(i % 1013) - 5.0f;
      m[i] = 0.0f;
      v[i] = 0.0f;
      g[i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;
      bf16[i] = 0;
    }
  });
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
  const double plain = MedianSeconds(warmup, steps, [&] { run(nullptr); });
  const double with_copy = MedianSeconds(warmup, steps, [&] { run(bf16.get()); });
  const double norm_seconds = MedianSeconds(warmup, steps, [&] {
    GradSumOfSquares({g.get(), n}, &pool);
  });
  for (const auto& [name, seconds, bytes] :
       {std::tuple<const char*, double, double>{"adamw", plain, 28.0},
        {"adamw+bf16", with_copy, 30.0},
        {"grad_norm", norm_seconds, 4.0}}) {
    const double gbps = bytes * n / seconds / 1e9;
    std::printf(
        "%-11s params=%-10zu %8.3f ms  %7.3f Gparam/s  %4.0f B/param  %6.2f GB/s  "
        "%5.1f%% of triad(24B)  %5.1f%% of triad(32B, with write-allocate)\n",
        name, n, seconds * 1e3, n / seconds / 1e9, bytes, gbps, 100.0 * gbps / triad.gbps_3_arrays,
        100.0 * gbps / triad.gbps_with_allocate);
  }
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
  std::printf("adamw_bench: threads=%d steps=%d (median) warmup=%d isa=%s\n", threads, steps,
              warmup, std::string(SimdIsaName(BestSupportedSimdIsa())).c_str());
  const size_t triad_n = static_cast<size_t>(absl::GetFlag(FLAGS_triad_elements));
  for (const std::string& text : absl::GetFlag(FLAGS_params)) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || n == 0) {
      std::fprintf(stderr, "adamw_bench: bad --params entry '%s'\n", text.c_str());
      return 2;
    }
    RunSize(pool, n, warmup, steps, triad_n);
  }
  return 0;
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) { return megatrain::engine::Main(argc, argv); }
