// The version of what megatrain_tokenize writes for given inputs; part of the daemon's token-file key.
#pragma once

namespace megatrain::engine {

// Bump whenever megatrain_tokenize's output for the same tokenizer and text
// changes (document order, end-of-document ids, normalisation, file format).
// The daemon names cached token files by this and the inputs' hashes
// (server/job_tokens.h), so a bump makes every job tokenize afresh instead of
// reusing a file an older tool wrote.
inline constexpr int kTokenizeOutputVersion = 1;

}  // namespace megatrain::engine
