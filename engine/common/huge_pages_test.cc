// Tests for AdviseHugePages: which pages get the advice (the "hg" VmFlag in
// /proc/self/smaps), no-op edges, errors, and that the data is kept; and for
// AllocateStreamingArray's alignment and advice by size.
#include "engine/common/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

bool KernelHasThp() { return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good(); }

// The VmFlags line of the mapping containing address, or "" if none does.
std::string VmFlagsAt(uintptr_t address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> lo >> dash >> hi && dash == '-' &&
        line.find(' ') != std::string::npos && line.find(':') > line.find(' ')) {
      inside = lo <= address && address < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool HasHugePageAdvice(uintptr_t address) {
  return (VmFlagsAt(address) + " ").find(" hg ") != std::string::npos;
}

// An anonymous mapping of `pages` huge pages plus one, unmapped on scope exit,
// with `aligned` the first huge-page boundary inside it.
class Mapping {
 public:
  explicit Mapping(size_t huge_pages) : bytes_((huge_pages + 1) * kHugePageBytes) {
    base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base_, MAP_FAILED);
    const uintptr_t b = reinterpret_cast<uintptr_t>(base_);
    aligned_ = (b + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  }
  ~Mapping() { munmap(base_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uintptr_t aligned() const { return aligned_; }

 private:
  size_t bytes_;
  void* base_;
  uintptr_t aligned_;
};

void* At(uintptr_t address) { return reinterpret_cast<void*>(address); }

TEST(AdviseHugePagesTest, RangesWithoutAWholeHugePageAreNoOps) {
  EXPECT_TRUE(AdviseHugePages(nullptr, 0).ok());
  EXPECT_TRUE(AdviseHugePages(nullptr, 3 * kHugePageBytes).ok());
  Mapping mapping(2);
  const uintptr_t a = mapping.aligned();
  EXPECT_TRUE(AdviseHugePages(At(a), 0).ok());
  EXPECT_TRUE(AdviseHugePages(At(a), kHugePageBytes - 1).ok());
  // Straddles a boundary but holds no whole huge page.
  EXPECT_TRUE(AdviseHugePages(At(a + 4096), kHugePageBytes + 4096).ok());
  EXPECT_FALSE(HasHugePageAdvice(a));
  EXPECT_FALSE(HasHugePageAdvice(a + kHugePageBytes));
}

TEST(AdviseHugePagesTest, AdvisesOnlyTheWholeHugePagesInside) {
  if (!KernelHasThp()) GTEST_SKIP() << "kernel without transparent huge pages";
  Mapping mapping(4);
  const uintptr_t a = mapping.aligned();
  // Starts 12 KiB before a boundary and ends 20 KiB after the second one
  // past it: exactly the two huge pages [a, a + 2 huge) are whole.
  const size_t odd_bytes = 2 * kHugePageBytes + 3 * 4096 + 5 * 4096 + 123;
  ASSERT_TRUE(AdviseHugePages(At(a - 3 * 4096), odd_bytes).ok());
  EXPECT_TRUE(HasHugePageAdvice(a));
  EXPECT_TRUE(HasHugePageAdvice(a + 2 * kHugePageBytes - 1));
  EXPECT_FALSE(HasHugePageAdvice(a - 4096));
  EXPECT_FALSE(HasHugePageAdvice(a + 2 * kHugePageBytes));
}

TEST(AdviseHugePagesTest, KeepsTheDataOfTouchedPages) {
  if (!KernelHasThp()) GTEST_SKIP() << "kernel without transparent huge pages";
  Mapping mapping(3);
  const uintptr_t a = mapping.aligned();
  const size_t words = 3 * kHugePageBytes / sizeof(uint32_t) - 7;
  uint32_t* data = static_cast<uint32_t*>(At(a));
  for (size_t i = 0; i < words; ++i) data[i] = static_cast<uint32_t>(i * 2654435761u);
  ASSERT_TRUE(AdviseHugePages(data, words * sizeof(uint32_t)).ok());
  size_t mismatches = 0;
  for (size_t i = 0; i < words; ++i)
    mismatches += data[i] != static_cast<uint32_t>(i * 2654435761u);
  EXPECT_EQ(mismatches, 0u);
}

TEST(AdviseHugePagesTest, UnmappedRangeIsAnErrorNamingTheCall) {
  if (!KernelHasThp()) GTEST_SKIP() << "kernel without transparent huge pages";
  uintptr_t a = 0;
  {
    Mapping mapping(2);
    a = mapping.aligned();
  }
  const absl::Status status = AdviseHugePages(At(a), 2 * kHugePageBytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("MADV_HUGEPAGE"), std::string::npos) << status;
}

TEST(AllocateStreamingArrayTest, BigArraysStartOnAnAdvisedHugePage) {
  const size_t bytes = kHugePageMinBytes + 12345;
  void* data = AllocateStreamingArray(bytes, 64);
  ASSERT_NE(data, nullptr);
  const uintptr_t a = reinterpret_cast<uintptr_t>(data);
  EXPECT_EQ(a % kHugePageBytes, 0u);
  if (KernelHasThp()) {
    EXPECT_TRUE(HasHugePageAdvice(a)) << VmFlagsAt(a);
  }
  std::memset(data, 0x5a, bytes);  // the whole requested size is usable
  EXPECT_EQ(static_cast<unsigned char*>(data)[bytes - 1], 0x5a);
  std::free(data);
}

TEST(AllocateStreamingArrayTest, SmallArraysUseTheSmallAlignment) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, kHugePageMinBytes - 1}) {
    void* data = AllocateStreamingArray(bytes, 4096);
    ASSERT_NE(data, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 4096, 0u) << bytes;
    if (bytes > 0) std::memset(data, 1, bytes);
    std::free(data);
  }
}

}  // namespace
}  // namespace megatrain::engine
