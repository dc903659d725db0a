#!/usr/bin/env bash
# CI test of seccomp_exec: the filter is active (calls outside @system-service get EPERM, a call
# newer than systemd's @known gets ENOSYS, an allowed one works), --report names each refused
# call and still returns EPERM, and the list holds what the unit needs (execve, io_uring).
# Args: SECCOMP_EXEC REPORT_LIB PROBE LIST (passed by the BUILD rule).
set -euo pipefail
exec_bin="$1" report="$(realpath "$2")" probe="$3" list="$4"
fail() { echo "FAIL: $*" >&2; exit 1; }

for name in execve exit_group clock_nanosleep io_uring_setup ioctl mmap; do
  grep -qx "allow $name" "$list" || fail "$list does not allow $name"
done
for name in adjtimex swapon acct reboot kexec_load init_module; do
  grep -qx "allow $name" "$list" && fail "$list allows $name (not in @system-service)"
done

# Without the filter adjtimex (read-only) and getpid succeed, so EPERM below is the filter's.
plain="$("$probe")"
echo "without the filter:"; echo "$plain"
grep -qx "adjtimex: ok" <<<"$plain" || fail "adjtimex fails without a filter: cannot test"

filtered="$("$exec_bin" --list "$list" -- "$probe")"
echo "under the filter:"; echo "$filtered"
for want in "adjtimex: EPERM" "swapon: EPERM" "acct: EPERM" "cachestat: ENOSYS" "getpid: ok"; do
  grep -qx "$want" <<<"$filtered" || fail "under the filter, expected '$want'"
done

reported="$("$exec_bin" --list "$list" --report "$report" -- "$probe" 2>"$TEST_TMPDIR/stderr")"
echo "with --report:"; echo "$reported"; cat "$TEST_TMPDIR/stderr"
[[ "$reported" == "$filtered" ]] || fail "--report changed what the calls return"
names="$(sed -n 's/^seccomp_report: refused syscall //p' "$TEST_TMPDIR/stderr" |
  while read -r nr; do "$exec_bin" --syscall-name "$nr"; done | sort | tr '\n' ' ')"
[[ "$names" == "acct adjtimex swapon " ]] || fail "--report named '$names', not acct adjtimex swapon"

# Set-up errors exit 126 with a message; the launcher prints nothing else.
if "$exec_bin" --list /nonexistent -- true 2>/dev/null; then fail "a missing list was accepted"; fi
[[ -z "$("$exec_bin" --list "$list" -- true 2>&1)" ]] || fail "the launcher printed something"
echo "seccomp_exec_test: all checks passed"
