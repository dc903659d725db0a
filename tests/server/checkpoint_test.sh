#!/usr/bin/env bash
# Checkpoints through a real megatraind: `megatrain checkpoint` on a running job, pause/resume,
# SIGTERM mid-job then restart (resumes from its checkpoint and ends with the same final weights
# as an uninterrupted run of the same spec), SIGKILL mid-job then restart (resumes and finishes).
#
# Nothing here depends on the machine's speed (issue 16, point 16): the daemon's test hook
# --test_hold_after_step=10 holds every job that reaches step 10 until it is asked to stop or
# checkpoint, so a job meant to be interrupted is still running when the test interrupts it.
source "$(dirname "$0")/daemon_test_lib.sh"

# spec <name> <steps> <every_steps>: a job writing under $WORK/out/<name>.
spec() {
  cat > "$WORK/$1.json" <<JSON
{"name": "$1", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$WORK/data/corpus.txt"], "eval_every_steps": $(( $2 < 10 ? $2 : 10 ))},
 "hyper": {"steps": $2, "batch_size": 4, "seq_len": 64, "lr": {"peak_lr": 0.001}},
 "checkpoints": {"every_steps": $3, "keep_last": 3},
 "output_dir": "$WORK/out/$1", "seed": 11}
JSON
  echo "$WORK/$1.json"
}

state() { cli status "$1" --json | jq -r .state; }
step() { cli status "$1" --json | jq -r '.progress.step // 0'; }
last_checkpoint() { cli status "$1" --json | jq -r '.progress.last_checkpoint // ""'; }

has_checkpoint() { [ -n "$(last_checkpoint "$1")" ]; }

# The final checkpoint's weights of a finished job.
final_weights() { echo "$(ls -d "$WORK/out/$1/checkpoints"/step-* | tail -n 1)/model.safetensors"; }

start_daemon --test_hold_after_step=10

# 1. Checkpoint now, on a running job.
id=$(cli submit --spec="$(spec now 2000 0)") || fail "submit"
await 120 "job $id to run a step" step_at_least "$id" 1
set +e
cli checkpoint job-999999 > /dev/null 2>&1; [ $? = 4 ] || fail "checkpoint of an unknown job: NOT_FOUND"
set -e
path=$(timeout 150 "$MEGATRAIN" --socket="$SOCKET" checkpoint "$id") || fail "checkpoint command"
[ -f "$path/model.safetensors" ] || fail "checkpoint path '$path' has no model.safetensors"
[ -f "$path/manifest.json" ] || fail "checkpoint path '$path' has no manifest.json"
record=$(timeout 150 "$MEGATRAIN" --socket="$SOCKET" checkpoint "$id" --json) || fail "checkpoint --json"
sha=$(json_field "$record" .manifest_sha256)
[ "$sha" = "$(sha256sum "$(json_field "$record" .path)/manifest.json" | cut -d' ' -f1)" ] ||
  fail "manifest_sha256 $sha does not match the manifest"

# 2. Pause the running job: it checkpoints and stops; the checkpoint RPC then refuses; a paused
# job can be cancelled.
cli pause "$id" > /dev/null || fail "pause"
await 120 "job $id to pause" state_is "$id" PAUSED
paused_step=$(step "$id")
[ "$paused_step" -ge 1 ] || fail "paused at step $paused_step"
paused_ckpt=$(last_checkpoint "$id")
[[ "$paused_ckpt" == *"$(printf 'step-%012d' "$paused_step")" ]] ||
  fail "pause checkpoint '$paused_ckpt' is not of step $paused_step"
set +e
cli checkpoint "$id" > /dev/null 2>&1; rc=$?
set -e
[ "$rc" != 0 ] || fail "checkpoint of a paused job should fail"
cli cancel "$id" > /dev/null || fail "cancel of a paused job"
[ "$(state "$id")" = CANCELLED ] || fail "paused job not cancelled"

# Pause a running job, resume it: it continues from the pause checkpoint and completes.
pr=$(cli submit --spec="$(spec pause 1000 300)")
await 120 "job $pr to reach the hold at step 10" step_at_least "$pr" 10
cli pause "$pr" > /dev/null || fail "pause of a running job"
await 120 "job $pr to pause" state_is "$pr" PAUSED
paused_step=$(step "$pr")
[ "$paused_step" -ge 1 ] && [ "$paused_step" -lt 1000 ] || fail "paused at step $paused_step"
cli resume "$pr" > /dev/null || fail "resume"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$pr" > /dev/null || fail "resumed job"
grep "event=job_resumed" "$WORK/daemon.log" | grep "job=$pr" | grep -q "from_step=$paused_step" ||
  fail "no 'resumed from step $paused_step' for $pr in the log"
[ -f "$(final_weights pause)" ] || fail "no final checkpoint of the paused job"

# Queued -> paused -> queued -> succeeded.
blocker=$(cli submit --spec="$(spec blocker 2000 0)")
short=$(cli submit --spec="$(spec short 6 3)")
[ "$(cli pause "$short" --json | jq -r .state)" = PAUSED ] || fail "pause of a queued job"
cli cancel "$blocker" > /dev/null
cli resume "$short" > /dev/null || fail "resume of a queued-then-paused job"
timeout 300 "$MEGATRAIN" --socket="$SOCKET" watch "$short" > /dev/null || fail "short job"
[ -f "$(final_weights short)" ] || fail "no final checkpoint of the short job"

# 3. SIGTERM mid-job: it checkpoints, goes back to QUEUED, resumes after the restart and ends with
# the same weights as an uninterrupted run.
steps=1500
term=$(cli submit --spec="$(spec term $steps 500)")
await 300 "job $term to pass step 3" step_at_least "$term" 3
stop_daemon
grep -q "interrupted by daemon shutdown after step" "$WORK/daemon.log" || fail "no interruption"
start_daemon  # without the hold: the resumed job and the reference run to their end
[ "$(state "$term")" != FAILED ] || fail "interrupted job failed on restart"
term_ckpt=$(last_checkpoint "$term")
[ -n "$term_ckpt" ] || fail "no checkpoint written at SIGTERM"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$term" > /dev/null || fail "resumed job"
resumed=$(grep "event=job_resumed" "$WORK/daemon.log" | grep "job=$term" | sed -n 's/.*from_step=\([0-9]*\).*/\1/p' | tail -n 1)
[ -n "$resumed" ] && [ "$resumed" -gt 0 ] || fail "job $term did not resume from a checkpoint"
ref=$(cli submit --spec="$(spec ref $steps 500)")
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$ref" > /dev/null || fail "reference job"
cmp "$(final_weights term)" "$(final_weights ref)" ||
  fail "resumed job's final weights differ from the uninterrupted run's"
[ "$(basename "$(dirname "$(final_weights term)")")" = "$(printf 'step-%012d' $steps)" ] ||
  fail "final checkpoint is not of step $steps"

# 4. SIGKILL mid-job: after the restart it resumes from its last checkpoint and finishes.
stop_daemon
start_daemon --test_hold_after_step=10  # held at step 10, after the checkpoint of step 5
kill9=$(cli submit --spec="$(spec kill $steps 5)")
await 300 "job $kill9 to commit a checkpoint" has_checkpoint "$kill9"
kill -KILL "$DAEMON_PID"
wait "$DAEMON_PID" 2> /dev/null || true
DAEMON_PID=""
start_daemon
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$kill9" > /dev/null || fail "job after SIGKILL"
grep "event=job_resumed" "$WORK/daemon.log" | grep -q "job=$kill9" || fail "job $kill9 did not resume"
[ "$(json_field "$(cli status "$kill9" --json)" .progress.step)" = $steps ] || fail "kill job steps"
stop_daemon
echo PASS
