// RecheckInput, RecheckJobInputs (see input_recheck.h).
#include "server/input_recheck.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"
#include "engine/common/unique_fd.h"

namespace megatrain::server {
namespace {

constexpr int kOpenFlags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;

// openat2(RESOLVE_NO_SYMLINKS); -1 with errno ENOSYS where the kernel lacks it.
int OpenNoSymlinks(const std::string& path) {
  open_how how{};
  how.flags = kOpenFlags;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how)));
}

}  // namespace

absl::Status RecheckInput(const std::string& field, const std::string& path, bool directory_ok,
                          bool use_openat2) {
  engine::UniqueFd fd(use_openat2 ? OpenNoSymlinks(path) : -1);
  if (!use_openat2) errno = ENOSYS;
  bool via_proc = false;
  if (!fd.valid() && (errno == ENOSYS || errno == EPERM)) {  // no openat2 (or filtered)
    fd.Reset(open(path.c_str(), kOpenFlags | O_NOFOLLOW));
    via_proc = true;
  }
  if (!fd.valid()) {
    const int error = errno;
    if (error == ELOOP) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": '", path,
                       "' now has a symlink on its way (none when the job was "
                       "submitted); refused when the job runs"));
    }
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(field, ": '", path, "' is gone"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": cannot open '", path, "': ", std::strerror(error)));
  }
  if (via_proc) {  // intermediate components may have been followed: the fd says where it is
    char target[PATH_MAX];
    const std::string link = absl::StrCat("/proc/self/fd/", fd.get());
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n < 0 || std::string(target, static_cast<size_t>(n)) != path) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": '", path, "' now resolves to '",
                       n < 0 ? std::string("?") : std::string(target, static_cast<size_t>(n)),
                       "'; refused when the job runs"));
    }
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": cannot stat '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) && !(directory_ok && S_ISDIR(st.st_mode))) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is now ",
                                                   engine::FileTypeName(st.st_mode),
                                                   "; inputs must be regular files"));
  }
  return absl::OkStatus();
}

absl::Status RecheckJobInputs(const ValidatedJob& job) {
  const engine::TextTrainingOptions& o = job.options;
  for (size_t i = 0; i < o.token_files.size(); ++i) {
    if (absl::Status s =
            RecheckInput(absl::StrCat("data.token_files[", i, "]"), o.token_files[i], false);
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < o.text_paths.size(); ++i) {
    if (absl::Status s =
            RecheckInput(absl::StrCat("data.text_files[", i, "]"), o.text_paths[i], true);
        !s.ok()) {
      return s;
    }
  }
  if (!o.tokenizer.empty() && o.tokenizer != "bytes") {
    if (absl::Status s = RecheckInput("data.tokenizer", o.tokenizer, false); !s.ok()) return s;
  }
  if (!o.init_from_hf_dir.empty()) {
    if (absl::Status s = RecheckInput("model.hf_directory", o.init_from_hf_dir, true); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace megatrain::server
