// RecheckJobInputs: a job's inputs checked again when it runs, not only at submit (a queued job
// can wait hours; issue 16, point 2). Validation resolved every input to a symlink-free path
// under a data root; here each is opened again without following any symlink (openat2 with
// RESOLVE_NO_SYMLINKS where the kernel has it, else O_NOFOLLOW and the opened fd's
// /proc/self/fd link, which must name the same path) and the opened fd must still be a regular
// file (or a directory where one was given). A path that now leads elsewhere or to a FIFO fails
// the job naming the field and the file, before the engine opens it.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {

using service::ValidatedJob;

// One input: PERMISSION_DENIED when `path` now has a symlink on its way or resolves elsewhere,
// NOT_FOUND when it is gone, INVALID_ARGUMENT when it is no longer a regular file (or a
// directory, with `directory_ok`). Messages start with `field`. `use_openat2` false takes the
// fallback for kernels without openat2 (tests check both).
absl::Status RecheckInput(const std::string& field, const std::string& path, bool directory_ok,
                          bool use_openat2 = true);

// Every input of `job`: data.token_files, data.text_files, a SentencePiece data.tokenizer and
// model.hf_directory (the directory itself; its files are confined at submit).
absl::Status RecheckJobInputs(const ValidatedJob& job);

}  // namespace megatrain::server
