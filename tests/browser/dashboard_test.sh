#!/usr/bin/env bash
# The dashboard in a real browser while a real megatraind trains: the job is listed as RUNNING,
# its loss curve has points and grows, each of the model's layers has its copy-in / compute /
# copy-out / stall bars, the memory tiers and a healthy daemon are shown, and the checkpoint
# taken first is listed with its manifest matching the recorded hash (dashboard_probe.py live);
# the page fits a phone's width. Screenshots go to the test's undeclared outputs. The JSON API
# answers the job's step history too.
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/browser/dashboard_page_lib.sh"
curl -sf "http://127.0.0.1:$PORT/api/jobs/$JOB" | jq -e '.history.steps | length > 0' > /dev/null \
  || fail "no step history in /api/jobs/$JOB"
cli checkpoint "$JOB" > /dev/null || fail "checkpoint of $JOB"
probe live
cli cancel "$JOB" > /dev/null || fail "cancel"
await 120 "job $JOB cancelled" state_is "$JOB" CANCELLED
stop_daemon
echo "PASS $(cat "$WORK/probe.json"); screenshot in $OUT"
