#!/usr/bin/env bash
# CI test of seccomp_exec: the filter is active (calls outside @system-service get EPERM, a call
# newer than systemd's @known gets ENOSYS, an allowed one works, a socket family outside the
# unit's gets EAFNOSUPPORT), --report names each refused call and still returns the same, the list
# holds what the unit needs (execve, io_uring), and a call added to a unit is allowed.
# Args: SECCOMP_EXEC REPORT_LIB PROBE LIST SYSCALL_LIST_SH (passed by the BUILD rule).
set -euo pipefail
exec_bin="$1" report="$(realpath "$2")" probe="$3" list="$4" syscall_list="$5"
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
for want in "adjtimex: EPERM" "swapon: EPERM" "acct: EPERM" "cachestat: ENOSYS" "getpid: ok" \
  "socket_unix: ok" "socket_netlink: EAFNOSUPPORT"; do
  grep -qx "$want" <<<"$filtered" || fail "under the filter, expected '$want'"
done

reported="$("$exec_bin" --list "$list" --report "$report" -- "$probe" 2>"$TEST_TMPDIR/stderr")"
echo "with --report:"; echo "$reported"; cat "$TEST_TMPDIR/stderr"
[[ "$reported" == "$filtered" ]] || fail "--report changed what the calls return"
names="$(sed -n 's/^seccomp_report: refused syscall \([0-9]*\).*/\1/p' "$TEST_TMPDIR/stderr" |
  while read -r nr; do "$exec_bin" --syscall-name "$nr"; done | sort | tr '\n' ' ')"
[[ "$names" == "acct adjtimex socket swapon " ]] ||
  fail "--report named '$names', not acct adjtimex socket swapon"
grep -qx "seccomp_report: refused syscall [0-9]* family 16" "$TEST_TMPDIR/stderr" ||
  fail "--report did not name the socket's family 16 (AF_NETLINK)"

# The fix docs/gpu.md gives (a call on its own SystemCallFilter= line) reaches the kit's list.
printf '[Service]\nSystemCallFilter=@system-service\n# why\nSystemCallFilter=adjtimex\n' \
  >"$TEST_TMPDIR/fixed.service"
"$syscall_list" "$TEST_TMPDIR/fixed.service" "$TEST_TMPDIR/fixed.txt"
fixed="$("$exec_bin" --list "$TEST_TMPDIR/fixed.txt" -- "$probe")"
grep -qx "adjtimex: ok" <<<"$fixed" || fail "adjtimex refused although the unit allows it: $fixed"
grep -qx "swapon: EPERM" <<<"$fixed" || fail "swapon allowed by the fixed unit: $fixed"
grep -qx "socket_netlink: ok" <<<"$fixed" || fail "no RestrictAddressFamilies=, yet netlink refused"

# Set-up errors exit 126 with a message; the launcher prints nothing else.
if "$exec_bin" --list /nonexistent -- true 2>/dev/null; then fail "a missing list was accepted"; fi
[[ -z "$("$exec_bin" --list "$list" -- true 2>&1)" ]] || fail "the launcher printed something"
echo "seccomp_exec_test: all checks passed"
