// RecheckInput, RecheckJobInputs (see input_recheck.h).
#include "server/input_recheck.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"
#include "engine/data/corpus_files.h"
#include "service/hf_directory_files.h"
#include "service/path_policy.h"

namespace megatrain::server {
namespace {

using service::kMaxHfDirectoryEntries;
using service::IsUnderRoot;

constexpr int kOpenFlags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;

// openat2(RESOLVE_NO_SYMLINKS); -1 with errno ENOSYS where the kernel lacks it.
int OpenNoSymlinks(const std::string& path) {
  open_how how{};
  how.flags = kOpenFlags;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how)));
}

// Where the open descriptor `fd` is, from its /proc/self/fd link; empty when unreadable.
std::string DescriptorPath(int fd) {
  char target[PATH_MAX];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}

// A held input must not block its readers: O_NONBLOCK was only there so that opening a FIFO
// could not block; a regular file's reads ignore it, but a clean descriptor is less surprising.
void ClearNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

// The *.json and *.safetensors files of the (already rechecked) directory `dir`, opened relative
// to its descriptor and checked: under a data root, regular, JSON within the caps.
absl::Status HoldHfDirectoryFiles(const std::string& dir, const engine::UniqueFd& dir_fd,
                                  const std::vector<std::string>& data_roots,
                                  engine::InputFiles& inputs) {
  const int listing_fd = fcntl(dir_fd.get(), F_DUPFD_CLOEXEC, 0);
  DIR* listing = listing_fd < 0 ? nullptr : fdopendir(listing_fd);
  if (listing == nullptr) {
    if (listing_fd >= 0) close(listing_fd);
    return absl::PermissionDeniedError(
        absl::StrCat("model.hf_directory: cannot list '", dir, "': ", std::strerror(errno)));
  }
  std::vector<std::string> names;
  int entries = 0;
  while (const dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (++entries > kMaxHfDirectoryEntries + 2) break;  // "." and ".."
    if (service::IsHeldHfDirectoryFile(name)) names.push_back(name);
  }
  closedir(listing);
  if (entries > kMaxHfDirectoryEntries + 2) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model.hf_directory: '", dir, "' has more than ", kMaxHfDirectoryEntries, " entries"));
  }
  for (const std::string& name : names) {
    const std::string field = absl::StrCat("model.hf_directory: ", name);
    // Relative to the checked directory's descriptor, so the directory cannot be swapped under
    // us; the entry itself may be a symlink (a Hugging Face cache links into its blobs), so it
    // is followed and where it led is checked instead.
    engine::UniqueFd fd(openat(dir_fd.get(), name.c_str(), kOpenFlags));
    if (!fd.valid()) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": cannot open: ", std::strerror(errno)));
    }
    const std::string real = DescriptorPath(fd.get());
    bool under = false;
    for (const std::string& root : data_roots) under = under || IsUnderRoot(real, root);
    if (!under) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": now resolves to '", real,
                       "', outside the data roots; refused when the job runs"));
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", real,
                                                     "' is not a regular file; refused when the "
                                                     "job runs"));
    }
    const uint64_t cap = service::HfDirectoryFileCap(name);
    if (static_cast<uint64_t>(st.st_size) > cap) {
      return absl::ResourceExhaustedError(
          absl::StrCat(field, ": ", st.st_size, " bytes, larger than ", cap >> 20, " MiB"));
    }
    ClearNonBlocking(fd.get());
    inputs.Add(absl::StrCat(dir, "/", name), std::move(fd));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<engine::UniqueFd> RecheckInput(const std::string& field, const std::string& path,
                                              bool directory_ok, bool use_openat2) {
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
    const std::string target = DescriptorPath(fd.get());
    if (target != path) {
      return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "' now resolves to '",
                                                      target.empty() ? std::string("?") : target,
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
  ClearNonBlocking(fd.get());
  return fd;
}

absl::StatusOr<engine::InputFiles> RecheckJobInputs(const ValidatedJob& job) {
  const engine::TrainingRunOptions& o = job.options;
  engine::InputFiles inputs;
  auto hold = [&](const std::string& field, const std::string& path) -> absl::Status {
    absl::StatusOr<engine::UniqueFd> fd = RecheckInput(field, path, false);
    if (!fd.ok()) return fd.status();
    inputs.Add(path, *std::move(fd));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < o.token_files.size(); ++i) {
    if (absl::Status s = hold(absl::StrCat("data.token_files[", i, "]"), o.token_files[i]);
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < o.sft_sample_paths.size(); ++i) {
    if (absl::Status s = hold(absl::StrCat("data.sample_files[", i, "]"), o.sft_sample_paths[i]);
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < job.chat_paths.size(); ++i) {
    if (absl::Status s = hold(absl::StrCat("data.chat_files[", i, "]"), job.chat_paths[i]);
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < o.text_paths.size(); ++i) {
    const std::string field = absl::StrCat("data.text_files[", i, "]");
    absl::StatusOr<engine::UniqueFd> fd = RecheckInput(field, o.text_paths[i], true);
    if (!fd.ok()) return fd.status();
    struct stat st;
    if (fstat(fd->get(), &st) == 0 && S_ISREG(st.st_mode)) {
      inputs.Add(o.text_paths[i], *std::move(fd));
      continue;
    }
    // A directory: its files as training lists them, each checked like a named file. A file
    // added after this is not held, and the run refuses to read it.
    absl::StatusOr<std::vector<std::string>> files = engine::ExpandCorpusFiles({o.text_paths[i]});
    if (!files.ok()) {
      return absl::Status(files.status().code(),
                          absl::StrCat(field, ": ", files.status().message()));
    }
    for (const std::string& f : *files) {
      if (inputs.size() >= kMaxHeldTextFiles) {
        return absl::ResourceExhaustedError(absl::StrCat(field, ": more than ", kMaxHeldTextFiles,
                                                         " text files (directories expanded)"));
      }
      if (absl::Status s = hold(field, f); !s.ok()) return s;
    }
  }
  if (!o.tokenizer.empty() && o.tokenizer != "bytes") {
    if (absl::Status s = hold("data.tokenizer", o.tokenizer); !s.ok()) return s;
  }
  if (!o.init_from_hf_dir.empty()) {
    absl::StatusOr<engine::UniqueFd> dir = RecheckInput("model.hf_directory", o.init_from_hf_dir,
                                                        /*directory_ok=*/true);
    if (!dir.ok()) return dir.status();
    if (absl::Status s = HoldHfDirectoryFiles(o.init_from_hf_dir, *dir, job.data_roots, inputs);
        !s.ok()) {
      return s;
    }
  }
  return inputs;
}

}  // namespace megatrain::server
