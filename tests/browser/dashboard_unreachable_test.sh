#!/usr/bin/env bash
# The dashboard in a real browser when the daemon dies: once the page shows the running job and a
# healthy daemon, megatraind is killed (SIGKILL) and the page must say "daemon unreachable"; when
# the daemon is started again on the same address, the page must show it healthy again without a
# reload (dashboard_probe.py unreachable). A screenshot goes to the test's undeclared outputs.
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/browser/dashboard_page_lib.sh"
mkdir -p "$WORK/signals"
probe unreachable "$WORK/signals" &
probe_pid=$!
killed() { [ -e "$WORK/signals/killed" ] || ! kill -0 "$probe_pid" 2> /dev/null; }
await 120 "the probe to see the daemon unreachable" killed
[ -e "$WORK/signals/killed" ] || { wait "$probe_pid"; fail "the probe ended early"; }
wait "$DAEMON_PID" 2> /dev/null && fail "the daemon was not killed"
start_daemon "${DASHBOARD_FLAGS[@]}"
wait "$probe_pid" || fail "the page did not recover"
stop_daemon
cp "$WORK/signals/"*.png "$OUT/" 2> /dev/null || true
echo "PASS $(cat "$WORK/probe.json"); screenshot in $OUT"
