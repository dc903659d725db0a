// The exit codes of every `megatrain` command, in one table (docs/daemon.md repeats it).
#pragma once

namespace megatrain::client {

inline constexpr int kExitOk = 0;
// The watched job failed or was cancelled; `audit` found the chain broken; `verify` found a
// mismatch, a break or a bad signature.
inline constexpr int kExitFailed = 1;
// Usage error (also `audit --db` on an unreadable file, and `verify` on an I/O error).
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;  // no daemon answered at the socket or address
inline constexpr int kExitRejected = 4;     // the daemon refused the request (message names why)
// The daemon did not answer within the command's deadline (DEADLINE_EXCEEDED): the request may
// still complete (a checkpoint still being written); never reported as "rejected".
inline constexpr int kExitDeadlineExceeded = 5;
// `verify`: every file and signature present matches, but some record is unsigned.
inline constexpr int kExitUnsigned = 6;

}  // namespace megatrain::client
