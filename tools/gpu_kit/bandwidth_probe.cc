// bandwidth_probe: host<->device copy bandwidth over pinned (and pageable) host memory, each
// direction alone and both at once on two streams; prints one JSON object. Without a usable
// GPU it prints {"skipped": "no CUDA device: ..."} and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

ABSL_FLAG(int, mib, 256, "Bytes per copy, in MiB.");
ABSL_FLAG(int, repeats, 10, "Timed copies per measurement (after one warm-up); the median counts.");

namespace {

void Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "bandwidth_probe: %s: %s\n", what, cudaGetErrorString(error));
  std::exit(1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Buffers {
  size_t bytes = 0;
  void* device_a = nullptr;
  void* device_b = nullptr;
  void* pinned_a = nullptr;
  void* pinned_b = nullptr;
  std::vector<char> pageable;
};

// Seconds of one copy of `bytes` on `stream`, timed with events on that stream.
double TimedCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                 cudaStream_t stream) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  Check(cudaEventRecord(start, stream), "cudaEventRecord");
  Check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
  Check(cudaEventRecord(stop, stream), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  Check(cudaEventDestroy(start), "cudaEventDestroy");
  Check(cudaEventDestroy(stop), "cudaEventDestroy");
  return ms / 1e3;
}

// Seconds for an H2D copy on one stream and a D2H copy on another, started together.
double TimedBidirectional(const Buffers& b, cudaStream_t up, cudaStream_t down) {
  cudaEvent_t start, up_done, down_done;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&up_done), "cudaEventCreate");
  Check(cudaEventCreate(&down_done), "cudaEventCreate");
  Check(cudaEventRecord(start, up), "cudaEventRecord");
  Check(cudaStreamWaitEvent(down, start, 0), "cudaStreamWaitEvent");
  Check(cudaMemcpyAsync(b.device_a, b.pinned_a, b.bytes, cudaMemcpyHostToDevice, up), "H2D");
  Check(cudaMemcpyAsync(b.pinned_b, b.device_b, b.bytes, cudaMemcpyDeviceToHost, down), "D2H");
  Check(cudaEventRecord(down_done, down), "cudaEventRecord");
  Check(cudaStreamWaitEvent(up, down_done, 0), "cudaStreamWaitEvent");
  Check(cudaEventRecord(up_done, up), "cudaEventRecord");
  Check(cudaEventSynchronize(up_done), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, up_done), "cudaEventElapsedTime");
  for (cudaEvent_t e : {start, up_done, down_done}) Check(cudaEventDestroy(e), "cudaEventDestroy");
  return ms / 1e3;
}

template <typename F>
double MedianSeconds(int repeats, F&& once) {
  once();  // warm-up
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) seconds.push_back(once());
  return Median(seconds);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess || count == 0) {
    const std::string why =
        error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount found 0 devices";
    std::printf("{\"skipped\": \"no CUDA device: %s\"}\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  Buffers b;
  b.bytes = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_mib))) << 20;
  Check(cudaMalloc(&b.device_a, b.bytes), "cudaMalloc");
  Check(cudaMalloc(&b.device_b, b.bytes), "cudaMalloc");
  Check(cudaHostAlloc(&b.pinned_a, b.bytes, cudaHostAllocDefault), "cudaHostAlloc");
  Check(cudaHostAlloc(&b.pinned_b, b.bytes, cudaHostAllocDefault), "cudaHostAlloc");
  b.pageable.assign(b.bytes, 1);
  Check(cudaMemset(b.device_b, 0, b.bytes), "cudaMemset");
  cudaStream_t up, down;
  Check(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking), "cudaStreamCreate");
  Check(cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking), "cudaStreamCreate");

  const double gb = static_cast<double>(b.bytes) / 1e9;
  const double h2d = MedianSeconds(repeats, [&] {
    return TimedCopy(b.device_a, b.pinned_a, b.bytes, cudaMemcpyHostToDevice, up);
  });
  const double d2h = MedianSeconds(repeats, [&] {
    return TimedCopy(b.pinned_b, b.device_b, b.bytes, cudaMemcpyDeviceToHost, down);
  });
  const double both = MedianSeconds(repeats, [&] { return TimedBidirectional(b, up, down); });
  const double h2d_pageable = MedianSeconds(repeats, [&] {
    return TimedCopy(b.device_a, b.pageable.data(), b.bytes, cudaMemcpyHostToDevice, up);
  });
  const double d2h_pageable = MedianSeconds(repeats, [&] {
    return TimedCopy(b.pageable.data(), b.device_b, b.bytes, cudaMemcpyDeviceToHost, down);
  });

  std::vector<std::string> fields = {
      absl::StrCat("\"device\": \"", prop.name, "\""),
      absl::StrCat("\"bytes_per_copy\": ", b.bytes),
      absl::StrCat("\"repeats\": ", repeats),
      absl::StrCat("\"h2d_pinned_gbps\": ", gb / h2d),
      absl::StrCat("\"d2h_pinned_gbps\": ", gb / d2h),
      absl::StrCat("\"bidirectional_pinned_gbps_total\": ", 2 * gb / both),
      absl::StrCat("\"h2d_pageable_gbps\": ", gb / h2d_pageable),
      absl::StrCat("\"d2h_pageable_gbps\": ", gb / d2h_pageable),
      "\"unit\": \"GB/s = 1e9 bytes/s, median of repeats, timed with CUDA events\""};
  std::printf("{%s}\n", absl::StrJoin(fields, ", ").c_str());

  Check(cudaStreamDestroy(up), "cudaStreamDestroy");
  Check(cudaStreamDestroy(down), "cudaStreamDestroy");
  Check(cudaFreeHost(b.pinned_a), "cudaFreeHost");
  Check(cudaFreeHost(b.pinned_b), "cudaFreeHost");
  Check(cudaFree(b.device_a), "cudaFree");
  Check(cudaFree(b.device_b), "cudaFree");
  return 0;
}
