// RecheckJobInputs: a job's inputs checked again when it runs, not only at submit (a queued job
// can wait hours; issue 16, point 2), and held open for the run. Validation resolved every input
// to a symlink-free path under a data root; here each is opened again without following any
// symlink (openat2 with RESOLVE_NO_SYMLINKS where the kernel has it, else O_NOFOLLOW and the
// opened fd's /proc/self/fd link, which must name the same path) and the opened fd must still be
// a regular file (or a directory where one was given). A path that now leads elsewhere or to a
// FIFO fails the job naming the field and the file. The descriptors that passed are returned:
// the run reads through them (engine::InputFiles), never by path again, so a file swapped after
// this check is not read.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/common/unique_fd.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {

using service::ValidatedJob;

inline constexpr size_t kMaxHeldTextFiles = 4096;

// One input, opened and checked: PERMISSION_DENIED when `path` now has a symlink on its way or
// resolves elsewhere, NOT_FOUND when it is gone, INVALID_ARGUMENT when it is no longer a
// regular file (or a directory, with `directory_ok`). Messages start with `field`.
// `use_openat2` false takes the fallback for kernels without openat2 (tests check both).
absl::StatusOr<engine::UniqueFd> RecheckInput(const std::string& field, const std::string& path,
                                              bool directory_ok, bool use_openat2 = true);

// Every input of `job`, held: data.token_files, data.text_files (a directory's files as
// engine::ExpandCorpusFiles lists them), a SentencePiece data.tokenizer and the *.json and
// *.safetensors files of model.hf_directory (symlinks there are followed, as at submit, but the
// opened file must be under job.data_roots, a regular file, and a JSON file within the caps of
// hf_directory_files.h). Keys are the paths as the engine names them. More than
// kMaxHeldTextFiles text files (directories expanded) is RESOURCE_EXHAUSTED: each is an open
// descriptor for the run and an argument of megatrain_tokenize.
absl::StatusOr<engine::InputFiles> RecheckJobInputs(const ValidatedJob& job);

}  // namespace megatrain::server
