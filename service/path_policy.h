// PathPolicy: request paths may only name files under configured roots; `..` components and
// symlinks resolving outside the roots are refused.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::service {

// `path` (absolute) without empty and '.' components: '//x/./y/' -> '/x/y'. Lexical only: no
// symlink is resolved and '..' is left as it is (request paths with '..' are refused).
std::string NormalizeAbsolutePath(const std::string& path);

// `path` is `root` or below it (both resolved, absolute).
bool IsUnderRoot(const std::string& path, const std::string& root);

class PathPolicy {
 public:
  // Roots are resolved (realpath) once; a root that does not exist is skipped.
  PathPolicy(const std::vector<std::string>& data_roots,
             const std::vector<std::string>& output_roots);

  // An existing, readable file or directory under a data root; returns its resolved path.
  // INVALID_ARGUMENT (empty, relative, `..`), NOT_FOUND, PERMISSION_DENIED (outside roots,
  // unreadable). Messages start with `field`.
  absl::StatusOr<std::string> ResolveInput(const std::string& field, const std::string& path) const;
  // A directory to create or reuse under an output root (its nearest existing ancestor is
  // resolved, so a symlink cannot lead outside); returns the resolved path, in one spelling for
  // all aliases ('/x/', '/x/./', '//x', a symlink to it). A dangling symlink on the way is
  // INVALID_ARGUMENT (it would be created as a file or through the link, under another name).
  absl::StatusOr<std::string> ResolveOutput(const std::string& field,
                                            const std::string& path) const;
  // The data roots, resolved (for the run-time recheck of inputs, input_recheck.h).
  const std::vector<std::string>& data_roots() const { return data_roots_; }

 private:
  std::vector<std::string> data_roots_;
  std::vector<std::string> output_roots_;
};

}  // namespace megatrain::service
