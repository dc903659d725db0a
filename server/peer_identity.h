// Who is calling: the Unix-socket peers' kernel credentials (SO_PEERCRED, taken when the
// connection is accepted, see unix_listener.h) by gRPC peer string, and the admin policy (root,
// the daemon's own uid, members of the admin group). gRPC does not expose a Unix peer's
// credentials itself, so megatraind accepts the connections and hands each fd to gRPC, whose
// peer string for it is "fd:<n>". The fd number is stable while any call of that connection
// runs: the call's stream holds its transport, whose endpoint owns the fd, so the number can be
// reused only after every call of the connection ended (issue 16, point 12).
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace megatrain::server {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Credentials of the accepted Unix connections, by fd. Thread-safe.
class PeerRegistry {
 public:
  void Record(int fd, const PeerCredentials& credentials);
  // For a gRPC peer string "fd:<n>"; nullopt for anything else (TCP peers, unknown fds).
  std::optional<PeerCredentials> Lookup(absl::string_view grpc_peer) const;

 private:
  mutable std::mutex mu_;
  std::map<int, PeerCredentials> by_fd_;
};

// The caller of one RPC as the daemon's checks see it.
struct Caller {
  std::optional<uid_t> uid;      // Unix-socket callers; none over TCP (the bearer token)
  bool admin = false;            // root, the daemon's uid, the admin group, or the TCP token
  std::string Describe() const;  // "uid 1000" or "the TCP token holder"
};

// Admins: uid 0, the daemon's own uid, and members of `admin_group` (primary or supplementary
// group; empty = none). Group membership is read from the system's user and group databases.
class AdminPolicy {
 public:
  AdminPolicy(std::string admin_group, uid_t daemon_uid)
      : admin_group_(std::move(admin_group)), daemon_uid_(daemon_uid) {}
  bool IsAdmin(const PeerCredentials& peer) const;
  const std::string& admin_group() const { return admin_group_; }

 private:
  const std::string admin_group_;
  const uid_t daemon_uid_;
};

}  // namespace megatrain::server
