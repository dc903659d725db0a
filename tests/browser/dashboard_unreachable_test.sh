#!/usr/bin/env bash
# The dashboard in a real browser when the daemon dies: once the page shows the running job and a
# healthy daemon, megatraind is killed (SIGKILL) and the page must say "daemon unreachable"
# (dashboard_probe.py unreachable); a screenshot goes to the test's undeclared outputs.
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/browser/dashboard_page_lib.sh"
probe unreachable
wait "$DAEMON_PID" 2> /dev/null && fail "the daemon was not killed"
DAEMON_PID=""
echo "PASS $(cat "$WORK/probe.json"); screenshot in $OUT"
