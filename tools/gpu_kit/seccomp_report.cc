// libseccomp_report.so: preloaded by `seccomp_exec --report` into the filtered command. Installs
// a SIGSYS handler that, for each system call the filter refused (SECCOMP_RET_TRAP), writes
// "seccomp_report: refused syscall NR" to stderr once per number and makes the call return
// -EPERM, as systemd's SystemCallErrorNumber=EPERM would; the program goes on. (A handler set by
// the launcher would not survive exec, hence a preloaded constructor.)
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace {

constexpr int kMaxReported = 1024;
std::atomic<bool> reported[kMaxReported];

// Async-signal-safe decimal formatting into buf; returns the length.
int FormatLine(int nr, char* buf) {
  const char prefix[] = "seccomp_report: refused syscall ";
  int n = 0;
  for (const char* p = prefix; *p != '\0'; ++p) buf[n++] = *p;
  char digits[12];
  int d = 0;
  unsigned value = nr < 0 ? 0u : static_cast<unsigned>(nr);
  do {
    digits[d++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (d > 0) buf[n++] = digits[--d];
  buf[n++] = '\n';
  return n;
}

void OnSigsys(int, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const int nr = info->si_syscall;
  if (nr < 0 || nr >= kMaxReported || !reported[nr].exchange(true)) {
    char line[64];
    const ssize_t ignored = write(STDERR_FILENO, line, FormatLine(nr, line));
    (void)ignored;
  }
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#elif defined(__aarch64__)
  uc->uc_mcontext.regs[0] = static_cast<unsigned long long>(-EPERM);
#else
#error "seccomp_report: set the system call's return register for this architecture"
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
