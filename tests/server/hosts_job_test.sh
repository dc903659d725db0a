#!/usr/bin/env bash
# Jobs on several machines through the daemon (docs/scale_out.md "Jobs on several machines"): a
# job with "hosts": ["localhost:2"] runs as two megatrain_rank processes that megatraind launches
# through mpirun (loopback) and supervises. Paused at step 2 (every rank checkpoints together) and
# resumed, it ends SUCCEEDED with a final checkpoint equal, byte for byte, to a job in the
# daemon's own process with the accumulation doubled. The same under ZeRO-1 (checkpoints written
# per shard) ends at the same losses. A checkpoint request reaches the ranks; `watch` follows the
# job as one; a cancel ends every rank; a rank killed with SIGKILL pauses the job naming the
# launcher's report, and the job then resumes from its last checkpoint to the same bytes; the
# daemon killed mid-run takes its ranks with it and relaunches the job when restarted. Bad
# hosts, hosts the daemon does not allow and zero1 without hosts are refused naming the field.
source "$(dirname "$0")/daemon_test_lib.sh"

# spec <name> <batch_size> [more JSON fields]: a job of micro-batches of 4 sequences.
spec() {
  cat > "$WORK/$1.json" <<JSON
{"name": "$1", "model": {"config_json_path": "$WORK/data/config.json"}, ${3:+$3,}
 "data": {"text_files": ["$WORK/data/corpus.txt"], "eval_every_steps": 3},
 "hyper": {"steps": 6, "batch_size": $2, "micro_batch_size": 4, "seq_len": 32,
           "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/$1", "seed": 5}
JSON
  echo "$WORK/$1.json"
}

final_checkpoint() { ls -d "$WORK/out/$1/checkpoints"/step-* | tail -n 1; }
# The ranks of the job named $1 (their command line starts with megatrain_rank, mpirun's names it
# later; the rank job file lies beside the job's checkpoints).
rank_pids() { pgrep -f "^[^ ]*/megatrain_rank --job=$WORK/out/$1/checkpoints/rank_job.binpb"; }
ranks_running() { rank_pids "$1" > /dev/null; }
no_ranks_running() { ! ranks_running "$1"; }

# finish_through_hold <id>: every job holds at step 2; a pause (a checkpoint at step 2) ends the
# hold, and the resumed job runs past it to the end.
finish_through_hold() {
  await 180 "job $1 to reach its hold at step 2" step_at_least "$1" 2
  cli pause "$1" > /dev/null || fail "pause of $1"
  await 180 "job $1 to pause" state_is "$1" PAUSED
  cli resume "$1" > /dev/null || fail "resume of $1"
  timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$1" > "$WORK/watch-$1.txt" ||
    fail "watch of $1: $(cat "$WORK/watch-$1.txt")"
  state_is "$1" SUCCEEDED || fail "job $1 ended $(job_state "$1")"
}

# Open MPI on loopback only, as root in containers, its session files in the test's directory.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR="${TEST_TMPDIR:-/tmp}"
loopback="--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo"
loopback+=" --mca oob_tcp_if_include lo"
start_daemon --threads=1 --test_hold_after_step=2 --mpirun_args="$loopback"

expect_refused "hosts: '-np' is not a host name" submit \
  --spec="$(spec bad1 4 '"hosts": ["-np"]')"
expect_refused "hosts: 'localhost:0': the ranks after ':' must be 1 to 64" submit \
  --spec="$(spec bad2 4 '"hosts": ["localhost:0"]')"
# Another machine only when the daemon's allowed_hosts names it (its user's ssh reaches it).
expect_refused "hosts: 'node7' is not one of the daemon's allowed_hosts" submit \
  --spec="$(spec bad5 4 '"hosts": ["localhost", "node7"]')"
expect_refused "hosts: 'a;b' is not a host name" submit --spec="$(spec bad3 4 '"hosts": ["a;b"]')"
expect_refused "zero1: true without hosts" submit --spec="$(spec bad4 4 '"zero1": true')"

# Two ranks, each one micro-batch of 4 per step, against one process with 2 micro-batches.
two=$(cli submit --spec="$(spec two 4 '"hosts": ["localhost:2"]')") || fail "submit hosts job"
await 180 "job $two to reach its hold at step 2" step_at_least "$two" 2
ranks_running two || fail "no megatrain_rank processes for $two"
cli checkpoint "$two" > /dev/null || fail "checkpoint request of $two"
finish_through_hold "$two"
grep -q "launching 2 ranks on localhost (2)" "$WORK/daemon.log" ||
  fail "the daemon's log does not show the launch"
[ "$(jq -r .ranks "$WORK/out/two/result.json")" = 2 ] ||
  fail "result.json lacks ranks 2: $(cat "$WORK/out/two/result.json")"
await 30 "the ranks of $two to be gone" no_ranks_running two

one=$(cli submit --spec="$(spec one 8)") || fail "submit the one-process job"
finish_through_hold "$one"

a=$(final_checkpoint two)
b=$(final_checkpoint one)
[ "$(basename "$a")" = "$(basename "$b")" ] || fail "final checkpoints $a and $b differ in step"
for f in model.safetensors optimizer.safetensors trainer_state.json; do
  cmp "$a/$f" "$b/$f" || fail "$f of the hosts job differs from one process: $(diff "$a/$f" "$b/$f" | head -20)"
done
# The job is seen as one: its progress counts every rank's tokens.
[ "$(cli status "$two" --json | jq -r .progress.tokens)" = "$(cli status "$one" --json | jq -r .progress.tokens)" ] ||
  fail "the hosts job's tokens are not the whole job's: $(cli status "$two" --json | jq -c .progress)"
# The checkpoint request at the hold was written by the ranks (step 2, besides the pause's).
ls -d "$WORK/out/two/checkpoints"/step-* > /dev/null || fail "no checkpoints of $two"

# ZeRO-1 over the two ranks: the same losses (the weights are those of the replicated run).
zero=$(cli submit --spec="$(spec zero 4 '"hosts": ["localhost:2"], "zero1": true')") ||
  fail "submit ZeRO-1 hosts job"
finish_through_hold "$zero"
for key in final_train_loss final_validation_loss; do
  [ "$(jq -r ".$key" "$WORK/out/zero/result.json")" = "$(jq -r ".$key" "$WORK/out/one/result.json")" ] ||
    fail "ZeRO-1 $key differs: $(cat "$WORK/out/zero/result.json")"
done

# A cancel ends every rank.
gone=$(cli submit --spec="$(spec gone 4 '"hosts": ["localhost:2"]')") || fail "submit $gone"
await 180 "job $gone to reach its hold at step 2" step_at_least "$gone" 2
cli cancel "$gone" > /dev/null || fail "cancel of $gone"
await 120 "job $gone to be cancelled" state_is "$gone" CANCELLED
await 60 "the ranks of $gone to be gone" no_ranks_running gone

# A rank killed: every rank ends, the job is paused naming what mpirun saw (the rank, its node,
# the signal), and a resume continues from its checkpoint of step 3 to the same final bytes.
killed=$(cli submit --spec="$(spec killed 4 '"hosts": ["localhost:2"]')") || fail "submit $killed"
await 180 "job $killed to reach its hold at step 2" step_at_least "$killed" 2
cli checkpoint "$killed" > /dev/null || fail "checkpoint request of $killed"
victim=$(rank_pids killed | tail -n 1)
[ -n "$victim" ] || fail "no rank of $killed to kill"
kill -KILL "$victim"
await 180 "job $killed to pause after its rank died" state_is "$killed" PAUSED
reason=$(cli status "$killed" --json | jq -r .failure_reason)
# (Open MPI 4.1 names the rank and node; the PID it prints may be 0.)
grep -q "mpirun noticed that process rank [01] with PID [0-9]* on node .* exited on signal 9" \
  <<< "$reason" || fail "the failure reason does not name the killed rank: $reason"
await 60 "the ranks of $killed to be gone" no_ranks_running killed
cli resume "$killed" > /dev/null || fail "resume of $killed"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$killed" > "$WORK/watch-killed.txt" ||
  fail "watch of $killed: $(cat "$WORK/watch-killed.txt")"
state_is "$killed" SUCCEEDED || fail "job $killed ended $(job_state "$killed")"
grep -q "resumed from .*step-0*3 at step 3" "$WORK/daemon.log" ||
  fail "the relaunched ranks did not resume from the checkpoint of step 3"
a=$(final_checkpoint killed)
for f in model.safetensors optimizer.safetensors trainer_state.json; do
  cmp "$a/$f" "$b/$f" || fail "$f of the killed and resumed hosts job differs from one process"
done

# The daemon killed while its ranks train: setpriv's parent-death signal ends mpirun and with it
# every rank (no run left writing checkpoints), and the restarted daemon relaunches the job from
# its checkpoint of step 3 to the same final bytes.
[ -x /usr/bin/setpriv ] || fail "/usr/bin/setpriv (util-linux) is missing: the daemon cannot end its ranks when it dies"
restarted=$(cli submit --spec="$(spec restarted 4 '"hosts": ["localhost:2"]')") ||
  fail "submit $restarted"
await 180 "job $restarted to reach its hold at step 2" step_at_least "$restarted" 2
cli checkpoint "$restarted" > /dev/null || fail "checkpoint request of $restarted"
kill -KILL "$DAEMON_PID"
wait "$DAEMON_PID" 2> /dev/null || true
DAEMON_PID=""
await 60 "the ranks of $restarted to end with the daemon" no_ranks_running restarted
start_daemon --threads=1 --test_hold_after_step=2 --mpirun_args="$loopback"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$restarted" > "$WORK/watch-restarted.txt" ||
  fail "watch of $restarted: $(cat "$WORK/watch-restarted.txt")"
state_is "$restarted" SUCCEEDED || fail "job $restarted ended $(job_state "$restarted")"
grep -q "job=$restarted line=\"resumed from .*restarted/checkpoints/step-0*3 at step 3" \
  "$WORK/daemon.log" || fail "the relaunched ranks of $restarted did not resume from step 3"
a=$(final_checkpoint restarted)
for f in model.safetensors optimizer.safetensors trainer_state.json; do
  cmp "$a/$f" "$b/$f" || fail "$f of the hosts job relaunched after a daemon death differs"
done
stop_daemon
# The daemon's log stays with the test's outputs (the launches, the ranks' lines, the pause).
[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && cp "$WORK/daemon.log" "$TEST_UNDECLARED_OUTPUTS_DIR/"
echo PASS
