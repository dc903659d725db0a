#!/usr/bin/env bash
# End to end: a real megatraind on a Unix socket in a temp dir; submit a small job with the CLI
# from a JSON spec with flag overrides, watch it to completion, read its status and output;
# then restart semantics: SIGTERM with a running and a queued job, restart, both come back.
source "$(dirname "$0")/daemon_test_lib.sh"

start_daemon
cat > "$WORK/job.json" <<JSON
{"name": "e2e", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$WORK/data/corpus.txt"], "eval_every_steps": 4},
 "hyper": {"steps": 100, "batch_size": 2, "seq_len": 32, "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/e2e", "seed": 3}
JSON
# A blocker keeps the job QUEUED until the watch is attached, so the watch
# sees the job run from its first step however fast it is.
blocker=$(cli submit --spec="$WORK/job.json" --steps=100000 --name=blocker \
  --output_dir="$WORK/out/blocker") || fail "submit blocker"
id=$(cli submit --spec="$WORK/job.json" --steps=8) || fail "submit"
[[ "$id" == job-* ]] || fail "submit printed '$id'"
cli watch "$id" > "$WORK/watch.txt" &
watcher=$!
for _ in $(seq 1 300); do [ -s "$WORK/watch.txt" ] && break; sleep 0.1; done
[ -s "$WORK/watch.txt" ] || fail "watch printed nothing for a queued job within 30 s"
cli cancel "$blocker" > /dev/null || fail "cancel blocker"
wait "$watcher" || fail "watch exited non-zero"
grep -q "SUCCEEDED step 8/8" "$WORK/watch.txt" || fail "watch output: $(cat "$WORK/watch.txt")"
[ "$(wc -l < "$WORK/watch.txt")" -ge 3 ] || fail "expected several progress lines: $(cat "$WORK/watch.txt")"

status=$(cli status "$id" --json)
[ "$(json_field "$status" .state)" = SUCCEEDED ] || fail "state: $status"
[ "$(json_field "$status" .progress.step)" = 8 ] || fail "step: $status"
[ "$(json_field "$status" .spec.hyper.steps)" = 8 ] || fail "flag override lost: $status"
loss=$(json_field "$status" .progress.loss)
python3 -c "import math,sys; v=float('$loss'); sys.exit(0 if math.isfinite(v) and 0 < v < 6 else 1)" \
  || fail "loss $loss"
[ -f "$WORK/out/e2e/result.json" ] || fail "no result.json"
[ "$(jq -r .steps "$WORK/out/e2e/result.json")" = 8 ] || fail "result.json steps"
listing=$(cli list)
grep -q "$id  SUCCEEDED" <<< "$listing" || fail "list: $listing"
[ "$(cli list --json --state=SUCCEEDED | jq '.jobs | length')" = 1 ] || fail "list --json"
cli daemon-status --json | jq -e '.healthy == true' > /dev/null || fail "daemon unhealthy"
top=$(cli top --iterations=2 --interval_seconds=0.1)  # not a terminal: screens one after another
[ "$(grep -c '^megatrain top' <<< "$top")" = 2 ] || fail "top screens: $top"
grep -q "$id *SUCCEEDED *\[#*\] 100%" <<< "$top" || fail "top: $top"
grep -q "healthy  queue 0" <<< "$top" || fail "top daemon line: $top"
cli plan --spec="$WORK/job.json" --json | jq -e '.parameters | tonumber > 0' > /dev/null || fail "plan"

# Exit codes scripts rely on.
set +e
cli status job-999999 > /dev/null 2>&1; [ $? = 4 ] || fail "NOT_FOUND should exit 4"
cli bogus-command > /dev/null 2>&1; [ $? = 2 ] || fail "unknown command should exit 2"
"$MEGATRAIN" --socket="$SOCKDIR/nowhere.sock" daemon-status > /dev/null 2>&1
[ $? = 3 ] || fail "unreachable daemon should exit 3"
"$MEGATRAIN" --socket="$SOCKDIR/nowhere.sock" top > "$WORK/top_down.txt" 2>&1
[ $? = 3 ] || fail "top of an unreachable daemon should exit 3"
grep -q "daemon unreachable" "$WORK/top_down.txt" || fail "top down: $(cat "$WORK/top_down.txt")"
set -e

# Restart semantics: a long job running and one queued; SIGTERM; both QUEUED after restart.
set +e
cli submit --spec="$WORK/job.json" > /dev/null 2>&1; [ $? = 4 ] || fail "a reused output_dir should exit 4"
set -e
long=$(cli submit --spec="$WORK/job.json" --steps=100000 --name=long --output_dir="$WORK/out/long")
queued=$(cli submit --spec="$WORK/job.json" --steps=4 --name=queued --output_dir="$WORK/out/queued")
# Bounded: the watch stream delivers the first step event, then grep exits.
(timeout 60 "$MEGATRAIN" --socket="$SOCKET" watch "$long" || true) |
  grep -m1 -q "RUNNING step [1-9]" || fail "long job never ran a step"
stop_daemon
grep -q "interrupted by daemon shutdown" "$WORK/daemon.log" || fail "no interruption logged"
start_daemon
[ "$(cli status "$queued" --json | jq -r .state)" = QUEUED ] || fail "queued job lost its state"
[ "$(cli status "$long" --json | jq -r .state)" != FAILED ] || fail "long job failed on restart"
cli cancel "$long" > /dev/null || fail "cancel"
set +e
timeout 60 "$MEGATRAIN" --socket="$SOCKET" watch "$long" > /dev/null; rc=$?
set -e
[ "$rc" = 1 ] || fail "watch of a cancelled job should exit 1, got $rc"
[ "$(cli status "$long" --json | jq -r .state)" = CANCELLED ] || fail "long not cancelled"
timeout 120 "$MEGATRAIN" --socket="$SOCKET" watch "$queued" > /dev/null || fail "queued job did not finish"
[ "$(cli status "$queued" --json | jq -r .state)" = SUCCEEDED ] || fail "queued job state"
grep -q "job=$queued" "$WORK/daemon.log" || fail "structured log lacks job ids"
stop_daemon
echo PASS
