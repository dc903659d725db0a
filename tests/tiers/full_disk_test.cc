// A real full filesystem (a small loop-mounted ext4): reserving the state file and writing past
// the end of the space fail with RESOURCE_EXHAUSTED naming the file and the offset. Needs root
// and loop devices; skips with the reason otherwise.
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/tiers/aligned_buffer.h"
#include "engine/tiers/nvme_state_store.h"
#include "engine/tiers/uring_block_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Mounts a fresh 8 MiB ext4 image at <TEST_TMPDIR>/small; unmounts on destruction.
class SmallFilesystem {
 public:
  SmallFilesystem() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string root = tmp != nullptr ? tmp : "/var/tmp";
    image_ = root + "/small.img";
    mount_point_ = root + "/small";
    std::filesystem::create_directories(mount_point_);
    if (::geteuid() != 0) {
      why_not_ = "not running as root";
      return;
    }
    if (!std::filesystem::exists("/usr/sbin/mkfs.ext4") || !std::filesystem::exists("/bin/mount")) {
      why_not_ = "mkfs.ext4 or mount missing";
      return;
    }
    const std::string make = absl::StrCat(
        "dd if=/dev/zero of=", image_, " bs=1M count=8 status=none && /usr/sbin/mkfs.ext4 -q -F ",
        image_, " && /bin/mount -o loop ", image_, " ", mount_point_);
    if (std::system(make.c_str()) != 0) {
      why_not_ = "cannot create or loop-mount an ext4 image (no loop devices?)";
      return;
    }
    mounted_ = true;
  }
  ~SmallFilesystem() {
    if (mounted_) (void)std::system(absl::StrCat("/bin/umount ", mount_point_).c_str());
    std::filesystem::remove(image_);
  }
  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }
  const std::string& dir() const { return mount_point_; }

 private:
  std::string image_, mount_point_, why_not_;
  bool mounted_ = false;
};

TEST(FullDisk, StateFileLargerThanTheDiskIsRefusedAtCreate) {
  SmallFilesystem fs;
  if (!fs.mounted()) GTEST_SKIP() << fs.why_not();
  auto io = UringBlockIo::Create();
  ASSERT_TRUE(io.ok()) << io.status();
  NvmeStateStoreOptions o;
  o.dir = fs.dir();
  auto store = NvmeStateStore::Create(**io, o, {3u << 20});  // 24 MiB of m and v
  ASSERT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted) << store.status();
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr(fs.dir() + "/optimizer_state.bin"), HasSubstr("offset 0")));
}

TEST(FullDisk, WritesPastTheFreeSpaceFailWithFileAndOffset) {
  SmallFilesystem fs;
  if (!fs.mounted()) GTEST_SKIP() << fs.why_not();
  auto io = UringBlockIo::Create();
  ASSERT_TRUE(io.ok()) << io.status();
  auto file = DirectFile::Open(fs.dir() + "/fill.bin", DirectFile::Mode::kCreateTruncate);
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer block = *AlignedBuffer::Allocate(1 << 20);
  absl::Status status;
  uint64_t offset = 0;
  for (; offset < (64u << 20) && status.ok(); offset += block.size()) {
    status = (*io)
                 ->Submit({IoOp::kWrite, &*file, offset, block.data(), block.size()})
                 .Wait(absl::Seconds(60));
  }
  ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(file->path()), HasSubstr("disk full"), HasSubstr("at offset ")));
  ASSERT_TRUE(file->Close().ok());
}

}  // namespace
}  // namespace megatrain::engine::tiers
