#!/usr/bin/env bash
# The dashboard's devices panel in a real browser: a megatraind driving two CPU devices
# (--devices=2) trains a devices=2 job, and the page lists both devices, in order, healthy, each
# with arena bytes in use (dashboard_probe.py, EXPECT_DEVICES=2); `megatrain daemon-status` lists
# them too. The default daemon's one device is covered by dashboard_test (EXPECT_DEVICES=1).
DASHBOARD_DAEMON_FLAGS=(--devices=2 --threads=1)
submit_dashboard_job() {
  cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/corpus.txt" \
    --steps=1000000 --batch_size=2 --seq_len=32 --lr=1e-3 --devices=2
}
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/browser/dashboard_page_lib.sh"
status=$(cli daemon-status) || fail "megatrain daemon-status"
for d in 0 1; do
  grep -q "^device $d: .* arena .* of .*  healthy$" <<< "$status" \
    || fail "megatrain daemon-status does not list device $d: $status"
done
export EXPECT_DEVICES=2 EXPECT_ARENA_IN_USE=1
probe devices
cli cancel "$JOB" > /dev/null || fail "cancel"
await 120 "job $JOB cancelled" state_is "$JOB" CANCELLED
stop_daemon
echo "PASS $(cat "$WORK/probe.json"); screenshot in $OUT"
