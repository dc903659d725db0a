// PathPolicy (see path_policy.h).
#include "service/path_policy.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/common/safe_files.h"

namespace megatrain::service {
namespace {

std::string RealPath(const std::string& path, int* error) {
  char buffer[PATH_MAX];
  if (realpath(path.c_str(), buffer) == nullptr) {
    *error = errno;
    return "";
  }
  *error = 0;
  return buffer;
}

bool IsUnder(const std::string& path, const std::string& root) { return IsUnderRoot(path, root); }

std::vector<std::string> ResolveRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> resolved;
  for (const std::string& root : roots) {
    int error;
    std::string real = RealPath(root, &error);
    if (!real.empty()) resolved.push_back(real);
  }
  return resolved;
}

absl::Status CheckSyntax(const std::string& field, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": path is required"));
  if (path.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": path of ", path.size(), " bytes is longer than 4096"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": path contains a NUL byte"));
  }
  if (path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not an absolute path"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path, "' contains a '..' component"));
    }
  }
  return absl::OkStatus();
}

absl::Status OutsideRoots(const std::string& field, const std::string& path,
                          const std::string& resolved, const std::vector<std::string>& roots) {
  return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "' resolves to '", resolved,
                                                  "', outside the allowed roots [",
                                                  absl::StrJoin(roots, ", "), "]"));
}

}  // namespace

bool IsUnderRoot(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

std::string NormalizeAbsolutePath(const std::string& path) {
  std::string out;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    absl::StrAppend(&out, "/", part);
  }
  return out.empty() ? std::string("/") : out;
}

PathPolicy::PathPolicy(const std::vector<std::string>& data_roots,
                       const std::vector<std::string>& output_roots)
    : data_roots_(ResolveRoots(data_roots)), output_roots_(ResolveRoots(output_roots)) {}

absl::StatusOr<std::string> PathPolicy::ResolveInput(const std::string& field,
                                                     const std::string& path) const {
  if (absl::Status s = CheckSyntax(field, path); !s.ok()) return s;
  int error;
  const std::string real = RealPath(path, &error);
  if (real.empty()) {
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(field, ": '", path, "' does not exist"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": cannot resolve '", path, "': ", std::strerror(error)));
  }
  bool allowed = false;
  for (const std::string& root : data_roots_) allowed = allowed || IsUnder(real, root);
  if (!allowed) return OutsideRoots(field, path, real, data_roots_);
  // Only regular files and directories: a FIFO would block whoever opens it (the request
  // thread, the runner), a device or socket never ends (issue 16, point 3).
  struct stat st;
  if (stat(real.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is ",
                                                   engine::FileTypeName(st.st_mode),
                                                   "; inputs must be regular files"));
  }
  if (access(real.c_str(), R_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "' is not readable"));
  }
  return real;
}

absl::StatusOr<std::string> PathPolicy::ResolveOutput(const std::string& field,
                                                      const std::string& path) const {
  if (absl::Status s = CheckSyntax(field, path); !s.ok()) return s;
  std::string existing = NormalizeAbsolutePath(path);
  std::string rest;
  int error = 0;
  std::string real;
  while (true) {
    real = RealPath(existing, &error);
    if (!real.empty()) break;
    if (error != ENOENT) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": cannot resolve '", existing, "': ", std::strerror(error)));
    }
    struct stat st;
    if (lstat(existing.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      const ssize_t n = readlink(existing.c_str(), target, sizeof(target) - 1);
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path, "': '", existing, "' is a dangling symlink (to '",
                       std::string(target, n > 0 ? static_cast<size_t>(n) : 0),
                       "'); create the directory first or name it directly"));
    }
    const size_t slash = existing.find_last_of('/');
    rest = absl::StrCat(existing.substr(slash), rest);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  const std::string resolved = real == "/" ? rest : absl::StrCat(real, rest);
  bool allowed = false;
  for (const std::string& root : output_roots_) allowed = allowed || IsUnder(resolved, root);
  if (!allowed) return OutsideRoots(field, path, resolved, output_roots_);
  return resolved.empty() ? std::string("/") : resolved;
}

}  // namespace megatrain::service
