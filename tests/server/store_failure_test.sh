#!/usr/bin/env bash
# Issue 16, point 10, against a real megatraind: while another process holds the state
# database's write lock every write fails (SQLITE_BUSY after the 5 s busy timeout). The daemon
# fails safe: the submit whose row could not be written is refused and never queued in memory,
# the daemon says it is unhealthy and why and refuses later jobs until restarted, the running
# job checkpoints and goes back to QUEUED, and the audit rows written while the lock was held
# reach the database afterwards with the chain intact. Waits are on states, bounded.
source "$(dirname "$0")/daemon_test_lib.sh"

args="--model_config=$WORK/data/config.json --text=$WORK/data/corpus.txt --batch_size=2 --seq_len=32 --lr=1e-3"

start_daemon --test_hold_after_step=3
running=$(cli submit $args --steps=1000 --output_dir="$WORK/out/running") || fail "submit"
await 120 "the job to reach its hold" step_at_least "$running" 3

# Another process takes the database's write lock and keeps it until told to let go.
coproc LOCKER {
  python3 -u -c '
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
c.execute("BEGIN EXCLUSIVE")
print("locked")
sys.stdin.readline()
c.execute("ROLLBACK")
print("released")' "$WORK/state/megatrain.db"
}
read -r -t 60 line <&"${LOCKER[0]}" || fail "the locker did not start"
[ "$line" = locked ] || fail "locker: $line"

expect_refused "state database: job not recorded, so not queued" submit $args --steps=2 \
  --output_dir="$WORK/out/refused"

echo >&"${LOCKER[1]}"
read -r -t 60 line <&"${LOCKER[0]}" || fail "the locker did not release"
[ "$line" = released ] || fail "locker: $line"

# It stays refusing jobs and says why; the running job checkpointed and is queued again.
status=$(cli daemon-status --json)
jq -e '.healthy != true' <<< "$status" > /dev/null || fail "still healthy: $status"
jq -r .unhealthy_reason <<< "$status" | grep -q "state database write failed" ||
  fail "no reason: $status"
expect_refused "state database write failed" submit $args --steps=2 --output_dir="$WORK/out/later"
await 120 "the running job to stop" state_is "$running" QUEUED
[ "$(cli list --json | jq '.jobs | length')" = 1 ] || fail "a refused job is listed: $(cli list)"
grep -q "event=store_failed" "$WORK/daemon.log" || fail "no store_failed log line"
stop_daemon

# After a restart the database has what memory had: one job, its stop in the audit chain.
start_daemon --test_hold_after_step=3
[ "$(cli list --json | jq '.jobs | length')" = 1 ] || fail "after restart: $(cli list)"
cli audit "$running" --json > "$WORK/audit.json" || fail "audit: $(cat "$WORK/audit.json")"
jq -e '.chain_ok == true' "$WORK/audit.json" > /dev/null || fail "chain broken: $(cat "$WORK/audit.json")"
jq -e '[.entries[].kind] | index("stopped_store_failed") != null' "$WORK/audit.json" > /dev/null ||
  fail "the stop's audit row is missing: $(jq -c '[.entries[].kind]' "$WORK/audit.json")"
cli daemon-status --json | jq -e '.healthy == true' > /dev/null || fail "unhealthy after restart"
# The hold was at step 3 only: the resumed job runs on and may have ended by now, whatever the
# machine's speed; either it is cancelled or it succeeded.
cli cancel "$running" > /dev/null || state_is "$running" SUCCEEDED || fail "cancel"
stop_daemon
echo PASS
