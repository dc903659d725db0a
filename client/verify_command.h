// `megatrain verify DIR [--pubkey FILE] [--base DIR] [--json]`: offline
// verification of checkpoints and their provenance chain (no daemon).
#pragma once

#include <string>
#include <vector>

namespace megatrain::client {

inline constexpr char kVerifyUsage[] =
    R"(Usage: megatrain verify DIR [--pubkey FILE] [--base DIR] [--json]

Checks a checkpoint directory (or the newest checkpoint of a checkpoint root)
against its provenance record: every file's and tensor's SHA-256, the Ed25519
signature, and the chain of records back to the base model. No daemon needed.

  --pubkey FILE  demand signatures by this key (hex, as daemon-status prints)
  --base DIR     re-hash the base model directory against the chain's start
  --json         print the report as JSON

Exit codes: 0 verified and signed, 1 verification failed, 2 usage or I/O
error, 6 verified but unsigned (3 is megatrain's "daemon unreachable").)";

// Runs the command on the arguments after "verify"; prints to stdout/stderr
// and returns the exit code.
int RunVerifyCommand(const std::vector<std::string>& args);

}  // namespace megatrain::client
