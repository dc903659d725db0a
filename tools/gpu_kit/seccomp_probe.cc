// seccomp_probe: the negative test's helper for seccomp_exec. Makes system calls outside
// @system-service (adjtimex in read-only mode succeeds unprivileged without a filter; swapon;
// acct) and cachestat (newer than systemd 252's @known), then getpid (allowed), and sockets of
// families AF_UNIX (allowed by the unit) and AF_NETLINK (not), printing one line `NAME: ok` or
// `NAME: ERRNO_NAME` each.
#include <linux/netlink.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timex.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace {

void Report(const char* name, long rc) {
  if (rc >= 0) {
    std::printf("%s: ok\n", name);
  } else {
    const int e = errno;
    std::printf("%s: %s\n", name,
                e == EPERM          ? "EPERM"
                : e == ENOSYS       ? "ENOSYS"
                : e == EAFNOSUPPORT ? "EAFNOSUPPORT"
                                    : std::strerror(e));
  }
}

}  // namespace

int main() {
  struct timex tx = {};  // modes 0: read the clock state only
  Report("adjtimex", syscall(SYS_adjtimex, &tx));
  Report("swapon", syscall(SYS_swapon, "/nonexistent-seccomp-probe", 0));
  Report("acct", syscall(SYS_acct, "/nonexistent-seccomp-probe"));
  // cachestat(2), number 451 on every architecture since Linux 6.5; a bad descriptor.
  Report("cachestat", syscall(451, -1, nullptr, nullptr, 0));
  Report("getpid", syscall(SYS_getpid));
  const long unix_fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  Report("socket_unix", unix_fd);
  const long netlink_fd = socket(AF_NETLINK, SOCK_DGRAM, NETLINK_ROUTE);
  Report("socket_netlink", netlink_fd);
  if (unix_fd >= 0) close(static_cast<int>(unix_fd));
  if (netlink_fd >= 0) close(static_cast<int>(netlink_fd));
  return 0;
}
