// libseccomp_report.so: preloaded by `seccomp_exec --report` into the filtered command. Installs
// a SIGSYS handler that, for each system call the filter refused (SECCOMP_RET_TRAP), writes
// "seccomp_report: refused syscall NR" to stderr once per number and makes the call return
// -EPERM, as systemd's SystemCallErrorNumber=EPERM would; socket(), refused only for its address
// family, gets "... refused syscall NR family F" once per family and -EAFNOSUPPORT, as
// RestrictAddressFamilies= answers. The program goes on. A refusal in the dynamic loader or in
// a linked library's constructor comes before this one's and still kills the process. (A
// handler set by the launcher would not survive exec, hence a preloaded constructor.)
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace {

constexpr int kMaxReported = 1024;
std::atomic<bool> reported[kMaxReported];
constexpr int kMaxFamily = 64;
std::atomic<bool> reported_family[kMaxFamily];

// Async-signal-safe: appends text or a decimal number to buf at n; returns the new length.
int Append(char* buf, int n, const char* text) {
  while (*text != '\0') buf[n++] = *text++;
  return n;
}
int Append(char* buf, int n, unsigned long value) {
  char digits[24];
  int d = 0;
  do {
    digits[d++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (d > 0) buf[n++] = digits[--d];
  return n;
}

void OnSigsys(int, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const int nr = info->si_syscall;
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  const unsigned long arg0 = uc->uc_mcontext.gregs[REG_RDI];
#elif defined(__aarch64__)
  const unsigned long arg0 = uc->uc_mcontext.regs[0];
#else
#error "seccomp_report: read the first argument and set the return register for this architecture"
#endif
  const bool socket = nr == SYS_socket;
  bool first;
  if (socket) {
    first = arg0 >= kMaxFamily || !reported_family[arg0].exchange(true);
  } else {
    first = nr < 0 || nr >= kMaxReported || !reported[nr].exchange(true);
  }
  if (first) {
    char line[96];
    int n = Append(line, 0, "seccomp_report: refused syscall ");
    n = Append(line, n, static_cast<unsigned long>(nr < 0 ? 0 : nr));
    if (socket) n = Append(line, Append(line, n, " family "), arg0);
    line[n++] = '\n';
    const ssize_t ignored = write(STDERR_FILENO, line, n);
    (void)ignored;
  }
  const long result = socket ? -EAFNOSUPPORT : -EPERM;
#if defined(__x86_64__)
  uc->uc_mcontext.gregs[REG_RAX] = result;
#else
  uc->uc_mcontext.regs[0] = static_cast<unsigned long long>(result);
#endif
  errno = saved_errno;
}

__attribute__((constructor)) void InstallSigsysHandler() {
  struct sigaction action = {};
  action.sa_sigaction = OnSigsys;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSYS, &action, nullptr);
  sigset_t sigsys;
  sigemptyset(&sigsys);
  sigaddset(&sigsys, SIGSYS);
  sigprocmask(SIG_UNBLOCK, &sigsys, nullptr);
}

}  // namespace
