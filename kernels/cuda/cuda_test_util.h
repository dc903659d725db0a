// Test helpers for the CUDA runtime tests: skip without a device, RAII device
// buffers and streams, bf16 host conversion, tolerance checks.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/bf16.h"

namespace megatrain::kernels::cuda::testing {

// GTEST_SKIPs the calling test when no CUDA device can be used.
#define MT_SKIP_WITHOUT_CUDA()                                           \
  do {                                                                   \
    int mt_device_count_ = 0;                                            \
    const cudaError_t mt_err_ = cudaGetDeviceCount(&mt_device_count_);   \
    if (mt_err_ != cudaSuccess) {                                        \
      GTEST_SKIP() << "no CUDA device: " << cudaGetErrorString(mt_err_); \
    }                                                                    \
    if (mt_device_count_ == 0) {                                         \
      GTEST_SKIP() << "no CUDA device: device count is 0";               \
    }                                                                    \
  } while (false)

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, count * sizeof(T)), cudaSuccess);
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  T* get() const { return static_cast<T*>(ptr_); }
  void Upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), count_);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t count_ = 0;
};

class TestStream {
 public:
  TestStream() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  ~TestStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }
  cudaError_t Sync() const { return cudaStreamSynchronize(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

// Deterministic pseudo-random values in [lo, hi), already representable in bf16.
inline std::vector<float> RandomBf16Values(size_t n, uint32_t seed, float lo, float hi) {
  std::vector<float> v(n);
  uint32_t state = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
    x = Bf16BitsToFloat32(Float32ToBf16Bits(lo + (hi - lo) * u));
  }
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Float32ToBf16Bits(v[i]);
  return out;
}

inline std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16BitsToFloat32(v[i]);
  return out;
}

// |got - want| <= rel * |want| + abs for every element; reports the first few misses.
inline void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rel,
                        double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size() && misses < 10; ++i) {
    const double bound = rel * std::fabs(want[i]) + abs;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= bound)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i] << " +- "
                    << bound;
      ++misses;
    }
  }
}

// |got - want| <= tolerance * max|want| over one tensor: for outputs whose error comes from
// chains of bf16 roundings, which scale with the tensor's magnitude, not each element's.
inline void ExpectCloseToMax(const float* got, const float* want, size_t count, double tolerance,
                             const std::string& what) {
  double max_abs = 0.0;
  for (size_t i = 0; i < count; ++i) max_abs = std::max(max_abs, std::fabs(double{want[i]}));
  ASSERT_GT(max_abs, 0.0) << what << ": reference is all zeros";
  const double bound = tolerance * max_abs;
  int misses = 0;
  for (size_t i = 0; i < count && misses < 8; ++i) {
    if (!(std::fabs(double{got[i]} - double{want[i]}) <= bound)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i] << " (max "
                    << max_abs << ", bound " << bound << ")";
      ++misses;
    }
  }
}

inline void ExpectCloseToMax(const std::vector<float>& got, const std::vector<float>& want,
                             double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ExpectCloseToMax(got.data(), want.data(), got.size(), tolerance, what);
}

// Tolerances of a whole layer or head on the GPU against the CPU's fp32 math, as a fraction of
// the largest |value| of each reference tensor. The CUDA path stores every intermediate in bf16
// (relative rounding 2^-9) where the CPU keeps fp32: about ten roundings chain through a layer's
// forward, more through its backward (bf16 activation gradients, cancellation in
// dS = P * (dP - delta)). Replaying exactly these rounding points on the CPU over the layer
// tests' shapes (3 bias variants x 8 seeds) gave at most 0.8% of max forward and 1.1% for any
// gradient; the bounds leave ~4x for the GPU's own fp32 summation orders. A wrong RoPE pairing,
// GQA head mapping, transpose or missing bias moves values by O(max), far beyond either bound.
inline constexpr double kLayerForwardTolerance = 3e-2;
inline constexpr double kLayerGradientTolerance = 4e-2;
// The loss is a mean over many tokens of lse - logit computed from bf16 logits: its error is far
// below one bf16 ulp of the logits.
inline constexpr double kLayerLossTolerance = 1e-2;

}  // namespace megatrain::kernels::cuda::testing
