#!/usr/bin/env bash
# The dashboard exposed (TLS + token; --metrics_exposed on 127.0.0.1 with a self-signed
# certificate) in a real browser: the token typed into the login form gives a session cookie
# that page scripts cannot read; with it the page shows the running job live over the event
# stream, as in dashboard_test (dashboard_probe.py exposed). Screenshots go to the test's
# undeclared outputs.
DASHBOARD_EXPOSED=1
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/browser/dashboard_page_lib.sh"
cli checkpoint "$JOB" > /dev/null || fail "checkpoint of $JOB"
probe exposed
cli cancel "$JOB" > /dev/null || fail "cancel"
await 120 "job $JOB cancelled" state_is "$JOB" CANCELLED
stop_daemon
echo "PASS $(cat "$WORK/probe.json"); screenshot in $OUT"
