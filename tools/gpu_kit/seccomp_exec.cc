// seccomp_exec: runs a command under the system call filter megatraind's systemd unit sets
// (SystemCallFilter=@system-service, SystemCallErrorNumber=EPERM, SystemCallArchitectures=native),
// so the filter can be checked where systemd is not the service manager (the bare GPU machine).
//
// Usage: seccomp_exec --list FILE [--report LIB] -- COMMAND [ARGS...]
//        seccomp_exec --syscall-name NR        (prints the native name of system call NR)
//
// FILE is the kit's syscall-filter.txt (syscall_list.sh: the unit's settings expanded by
// systemd-analyze at kit build time):
//   1. `allow NAME` lines: allowed (the unit's SystemCallFilter=, @system-service with nested
//      groups, plus @default, which systemd adds to every allow list: execve, exit, time and
//      sleep calls).
//   2. `known NAME` lines: @known. A system call number outside @known and not allowed answers
//      ENOSYS, as systemd >= 247 does, so libc's fallbacks for newer calls behave the same.
//   3. Everything else answers EPERM (SystemCallErrorNumber=EPERM); a call from another
//      architecture (i386, x32) kills the process (SystemCallArchitectures=native).
//   4. `family AF_X` lines (the unit's RestrictAddressFamilies=): socket() for any other family
//      answers EAFNOSUPPORT, from a second filter as systemd does (none: any family).
// With --report LIB, a refused call raises SIGSYS instead of failing quietly, and LIB
// (libseccomp_report.so, put on LD_PRELOAD) names it on stderr and returns EPERM to the caller,
// so the run behaves as under systemd while saying what was refused. The launcher itself prints
// nothing once the filter is loaded; a set-up error exits 126, a command not run 127.
#include <seccomp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Numbers beyond every architecture's table today; the ENOSYS rules cover [0, kMaxSyscall).
constexpr int kMaxSyscall = 1024;

int Fail(const std::string& what) {
  std::fprintf(stderr, "seccomp_exec: %s\n", what.c_str());
  return 126;
}

struct FilterList {
  std::vector<std::string> allow;
  std::vector<std::string> known;
  std::vector<std::string> families;
};

bool ReadList(const std::string& path, FilterList& list, std::string& error) {
  std::ifstream in(path);
  if (!in) {
    error = "cannot read " + path;
    return false;
  }
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind, name;
    fields >> kind >> name;
    if (kind == "allow" && !name.empty()) {
      list.allow.push_back(name);
    } else if (kind == "known" && !name.empty()) {
      list.known.push_back(name);
    } else if (kind == "family" && !name.empty()) {
      list.families.push_back(name);
    } else {
      error = path + ":" + std::to_string(number) + ": expected `allow|known|family NAME`";
      return false;
    }
  }
  if (list.allow.empty() || list.known.empty()) {
    error = path + " has no allow or no known lines";
    return false;
  }
  return true;
}

// The families systemd's RestrictAddressFamilies= names that this launcher knows.
bool ParseFamilies(const std::vector<std::string>& names, std::set<int>& families,
                   std::string& error) {
  static const struct {
    const char* name;
    int family;
  } kFamilies[] = {{"AF_UNIX", AF_UNIX},       {"AF_INET", AF_INET},     {"AF_INET6", AF_INET6},
                   {"AF_NETLINK", AF_NETLINK}, {"AF_PACKET", AF_PACKET}, {"AF_VSOCK", AF_VSOCK}};
  for (const std::string& name : names) {
    bool found = false;
    for (const auto& f : kFamilies) {
      if (name == f.name) {
        families.insert(f.family);
        found = true;
      }
    }
    if (!found) {
      error = "unknown address family " + name;
      return false;
    }
  }
  return true;
}

// A second filter (stacked; the stricter answer wins): socket() with a family outside `families`
// answers EAFNOSUPPORT (TRAP under --report: the handler answers EAFNOSUPPORT for socket).
std::string LoadFamilyFilter(const std::set<int>& families, bool report) {
  const uint32_t refuse = report ? SCMP_ACT_TRAP : SCMP_ACT_ERRNO(EAFNOSUPPORT);
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return "seccomp_init failed";
  const scmp_datum_t first = *families.begin(), last = *families.rbegin();
  int rc = seccomp_rule_add_exact(ctx, refuse, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_LT, first));
  if (rc == 0) {
    rc = seccomp_rule_add_exact(ctx, refuse, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_GT, last));
  }
  for (scmp_datum_t family = first + 1; family < last && rc == 0; ++family) {
    if (families.count(static_cast<int>(family)) != 0) continue;
    rc = seccomp_rule_add_exact(ctx, refuse, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, family));
  }
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  return rc == 0 ? "" : std::string("address family filter: ") + std::strerror(-rc);
}

// Builds and loads the filter; returns "" or what failed.
std::string LoadFilter(const FilterList& list, bool report) {
  const uint32_t refuse = report ? SCMP_ACT_TRAP : SCMP_ACT_ERRNO(EPERM);
  scmp_filter_ctx ctx = seccomp_init(refuse);
  if (ctx == nullptr) return "seccomp_init failed";
  std::string error;
  std::set<int> allowed, known;
  // Native architecture only (seccomp_init's default); any other one kills the process.
  if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) != 0) {
    error = "seccomp_attr_set(BADARCH)";
  }
  // A binary tree: ~900 rules stay cheap per call.
  if (error.empty()) seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
  for (const std::string& name : list.known) {
    const int nr = seccomp_syscall_resolve_name(name.c_str());
    if (nr >= 0) known.insert(nr);
  }
  for (const std::string& name : list.allow) {
    if (!error.empty()) break;
    const int nr = seccomp_syscall_resolve_name(name.c_str());
    // Unknown to libseccomp, or not a call of this architecture (a negative pseudo number):
    // systemd skips those too.
    if (nr < 0) continue;
    allowed.insert(nr);
    known.insert(nr);
    const int rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ALLOW, nr, 0);
    if (rc != 0) error = "allowing " + name + ": " + std::strerror(-rc);
  }
  for (int nr = 0; nr < kMaxSyscall && error.empty(); ++nr) {
    if (known.count(nr) != 0) continue;
    const int rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    if (rc != 0) error = "ENOSYS rule for " + std::to_string(nr) + ": " + std::strerror(-rc);
  }
  // seccomp_load sets no_new_privs first (the unit has NoNewPrivileges=yes too).
  if (error.empty()) {
    const int rc = seccomp_load(ctx);
    if (rc != 0) error = std::string("seccomp_load: ") + std::strerror(-rc);
  }
  seccomp_release(ctx);
  return error;
}

int PrintName(const char* arg) {
  char* end = nullptr;
  const long nr = std::strtol(arg, &end, 10);
  if (end == arg || *end != '\0' || nr < 0) return Fail(std::string("not a number: ") + arg);
  char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, static_cast<int>(nr));
  std::printf("%s\n", name != nullptr ? name : "unknown");
  std::free(name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string list_path, report_lib;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--syscall-name" && i + 1 < argc) return PrintName(argv[i + 1]);
    if (arg == "--list" && i + 1 < argc) {
      list_path = argv[++i];
    } else if (arg == "--report" && i + 1 < argc) {
      report_lib = argv[++i];
    } else if (arg == "--") {
      ++i;
      break;
    } else {
      return Fail(
          "usage: seccomp_exec --list FILE [--report LIB] -- COMMAND [ARGS...] | "
          "--syscall-name NR");
    }
  }
  if (list_path.empty() || i >= argc) return Fail("--list FILE and a command are needed");
  FilterList list;
  std::string error;
  if (!ReadList(list_path, list, error)) return Fail(error);
  std::set<int> families;
  if (!ParseFamilies(list.families, families, error)) return Fail(error);
  if (!report_lib.empty()) {
    if (access(report_lib.c_str(), R_OK) != 0) return Fail("cannot read " + report_lib);
    const char* preload = std::getenv("LD_PRELOAD");
    const std::string value =
        report_lib + (preload != nullptr && *preload != '\0' ? std::string(":") + preload : "");
    setenv("LD_PRELOAD", value.c_str(), 1);
  }
  if (!families.empty()) {
    error = LoadFamilyFilter(families, !report_lib.empty());
    if (!error.empty()) return Fail(error);
  }
  error = LoadFilter(list, !report_lib.empty());
  if (!error.empty()) return Fail(error);
  execvp(argv[i], argv + i);
  const int saved = errno;
  std::fprintf(stderr, "seccomp_exec: cannot run %s: %s\n", argv[i], std::strerror(saved));
  return 127;
}
