// Bit-for-bit comparison of two training runs' losses and per-entry arrays
// (masters, gradients), for the invariance tests of tests/engine.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace megatrain::engine::testing {

inline void ExpectSameLosses(const std::vector<double>& a, const std::vector<double>& b,
                             const std::string& name) {
  ASSERT_EQ(a.size(), b.size()) << name;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(double)), 0)
        << name << " step " << i << ": " << a[i] << " vs " << b[i];
  }
}

inline void ExpectSameArrays(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t e = 0; e < a.size(); ++e) {
    ASSERT_EQ(a[e].size(), b[e].size()) << what;
    EXPECT_EQ(std::memcmp(a[e].data(), b[e].data(), a[e].size() * sizeof(float)), 0)
        << what << ": entry " << e << " differs";
  }
}

}  // namespace megatrain::engine::testing
