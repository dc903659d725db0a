// PeerRegistry, Caller and AdminPolicy (see peer_identity.h).
#include "server/peer_identity.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace megatrain::server {

void PeerRegistry::Record(int fd, const PeerCredentials& credentials) {
  std::lock_guard<std::mutex> lock(mu_);
  by_fd_[fd] = credentials;
}

std::optional<PeerCredentials> PeerRegistry::Lookup(absl::string_view grpc_peer) const {
  if (!absl::ConsumePrefix(&grpc_peer, "fd:")) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(grpc_peer, &fd)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

std::string Caller::Describe() const {
  return uid.has_value() ? absl::StrCat("uid ", *uid) : std::string("the TCP token holder");
}

bool AdminPolicy::IsAdmin(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == daemon_uid_) return true;
  if (admin_group_.empty()) return false;
  group g{};
  group* found = nullptr;
  std::vector<char> buffer(16384);
  if (getgrnam_r(admin_group_.c_str(), &g, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return false;
  }
  const gid_t admin_gid = g.gr_gid;
  if (peer.gid == admin_gid) return true;
  passwd pw{};
  passwd* user = nullptr;
  std::vector<char> pw_buffer(16384);
  if (getpwuid_r(peer.uid, &pw, pw_buffer.data(), pw_buffer.size(), &user) != 0 ||
      user == nullptr) {
    return false;  // no user entry: only the primary group counts
  }
  int count = 64;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  if (getgrouplist(user->pw_name, user->pw_gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count));
    if (getgrouplist(user->pw_name, user->pw_gid, groups.data(), &count) < 0) return false;
  }
  groups.resize(static_cast<size_t>(count));
  for (gid_t gid : groups) {
    if (gid == admin_gid) return true;
  }
  return false;
}

}  // namespace megatrain::server
