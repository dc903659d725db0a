#!/usr/bin/env bash
# The kit's syscall_filter stages: runs a training run or megatraind under megatraind's unit's
# system call filter (seccomp_exec + syscall-filter.txt: @system-service, EPERM), then once more
# with --report to name each refused call. Ends with one line `syscall_filter: ...` that run.sh
# copies into the stage's note; exits with the first run's status (the second only names).
# Usage: syscall_filter.sh KIT train TRAIN_LOCAL_ARGS...   (train_local under the filter)
#        syscall_filter.sh KIT daemon DEVICE               (daemon_smoke.sh, megatraind under it)
set -uo pipefail
kit="$1" what="$2"
shift 2
args=("$@")

# filtered [--report LIB]: the stage's command under seccomp_exec.
filtered() {
  local launcher=("$kit/bin/seccomp_exec" --list "$kit/syscall-filter.txt" "$@" --)
  if [[ "$what" == daemon ]]; then
    MEGATRAIND_LAUNCHER="${launcher[*]}" "$kit/daemon_smoke.sh" "$kit" "${args[@]}"
  else
    "${launcher[@]}" "$kit/bin/train_local" "${args[@]}"
  fi
}

echo "--- under the filter (refused calls answer EPERM, as under systemd)"
filtered
rc=$?
echo "--- again, naming each refused call (SIGSYS reported by libseccomp_report.so, then EPERM)"
report="$(mktemp)"
filtered --report "$kit/bin/libseccomp_report.so" 2>&1 | tee "$report"
report_rc=${PIPESTATUS[0]}
refused=""
for nr in $(sed -n 's/.*seccomp_report: refused syscall \([0-9]*\)$/\1/p' "$report" | sort -nu); do
  refused+=" $("$kit/bin/seccomp_exec" --syscall-name "$nr")($nr)"
done
# socket() refused for its address family (RestrictAddressFamilies=): the family's number.
for family in $(sed -n 's/.*seccomp_report: refused syscall [0-9]* family \([0-9]*\)$/\1/p' "$report" |
  sort -nu); do
  refused+=" socket(address family $family)"
done
rm -f "$report"
summary="exit $rc under the filter; refused:${refused:- none}"
((report_rc == 128 + 31)) && summary+="; the --report run died of SIGSYS (a refusal it could not catch)"
((report_rc != rc && report_rc != 128 + 31)) && summary+="; the --report run exited $report_rc"
echo "syscall_filter: $summary"
exit "$rc"
