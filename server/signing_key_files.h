// Where the daemon keeps its provenance key under its state directory (read by the daemon and by
// its ranks on the same machine).
#pragma once

namespace megatrain::server {

// The daemon's Ed25519 key (provenance): <state_dir>/signing_key (PKCS#8 PEM, 0600) and its
// public key beside it in signing_key.pub (64 hex digits, 0644).
inline constexpr char kSigningKeyFileName[] = "signing_key";
inline constexpr char kPublicKeyFileName[] = "signing_key.pub";

}  // namespace megatrain::server
