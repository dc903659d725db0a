#!/usr/bin/env bash
# Issue 16 against a real megatraind in a temp dir: planted symlinks are never written through
# (result.json, the O_DIRECT probe), FIFOs are refused as inputs at submit and at run without
# blocking, a token file truncated under a running job does not kill the daemon, a minimal submit
# takes the documented defaults, log lines carry no raw control characters, SIGHUP is a clean
# stop, a job that keeps killing the daemon is quarantined, and plans beyond the machine's RAM
# are refused. Every wait is on a state (the daemon's --test_hold_after_step hook), never a time.
source "$(dirname "$0")/daemon_test_lib.sh"

state() { cli status "$1" --json | jq -r .state; }
job_args() { echo "--model_config=$WORK/data/config.json --text=$WORK/data/corpus.txt --batch_size=2 --seq_len=32 --lr=1e-3"; }

start_daemon --test_hold_after_step=3

# Point 17: a minimal submit (no --lr, --batch_size, --seq_len) takes the documented defaults.
help_text=$("$MEGATRAIN" --help 2>&1 || true)  # absl's --help exits 1
grep -q "lr 3e-4" <<< "$help_text" || fail "--help does not show the lr default"
min=$(cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/corpus.txt" \
  --steps=2 --output_dir="$WORK/out/minimal") || fail "minimal submit refused"
timeout 300 "$MEGATRAIN" --socket="$SOCKET" watch "$min" > /dev/null || fail "minimal job failed"
[ "$(jq -r .steps "$WORK/out/minimal/result.json")" = 2 ] || fail "minimal job result"

# Point 6: ram_bytes = 0 is the machine's RAM, and a budget beyond the machine is refused.
cat > "$WORK/huge_ram.json" <<JSON
{"memory": {"ramBytes": "1125899906842624"}}
JSON
expect_refused "physical RAM" submit --spec="$WORK/huge_ram.json" $(job_args) --steps=2

# Point 1: a symlink planted at result.json in a group-writable output directory.
echo precious > "$WORK/victim"
mkdir -p "$WORK/out/planted"
ln -s "$WORK/victim" "$WORK/out/planted/result.json"
planted=$(cli submit $(job_args) --steps=2 --output_dir="$WORK/out/planted") || fail "submit planted"
timeout 300 "$MEGATRAIN" --socket="$SOCKET" watch "$planted" > /dev/null || fail "planted job failed"
[ "$(cat "$WORK/victim")" = precious ] || fail "result.json was written through the symlink"
[ -f "$WORK/out/planted/result.json" ] && [ ! -L "$WORK/out/planted/result.json" ] ||
  fail "result.json is not a regular file"
[ "$(stat -c %a "$WORK/out/planted/checkpoints")" = 750 ] ||
  fail "checkpoints directory mode $(stat -c %a "$WORK/out/planted/checkpoints"), not 750"

# Point 1: the O_DIRECT probe of memory.nvme_dir (run by a Plan) never follows a planted symlink.
mkdir -p "$WORK/out/nvme"
ln -s "$WORK/victim" "$WORK/out/nvme/.megatrain_odirect_probe.$DAEMON_PID"
cat > "$WORK/nvme.json" <<JSON
{"memory": {"nvmeDir": "$WORK/out/nvme", "nvmeBytes": "1048576", "statesOnNvme": true}}
JSON
set +e
cli plan --spec="$WORK/nvme.json" $(job_args) --steps=2 > /dev/null 2>&1
set -e
[ "$(cat "$WORK/victim")" = precious ] || fail "the O_DIRECT probe wrote through the symlink"

# Point 3: FIFOs are refused at submit at once, naming the field; the daemon keeps answering.
mkfifo "$WORK/data/pipe.u16" "$WORK/data/pipe.txt"
expect_refused "is a FIFO" submit --spec=<(echo "{\"data\": {\"tokenFiles\": [\"$WORK/data/pipe.u16\"]}}") \
  --model_config="$WORK/data/config.json" --steps=2 --batch_size=2 --seq_len=32
expect_refused "data.text_files[0]" submit --model_config="$WORK/data/config.json" \
  --text="$WORK/data/pipe.txt" --steps=2
cli daemon-status > /dev/null || fail "daemon stopped answering after the FIFO submits"

# Point 3 at run time: a queued job's text file becomes a FIFO before it runs. The job fails
# naming it; the runner never blocks (the next job runs, SIGHUP below stops promptly).
cp "$WORK/data/corpus.txt" "$WORK/data/swapped.txt"
blocker=$(cli submit $(job_args) --steps=1000 --output_dir="$WORK/out/blocker") || fail "submit blocker"
await 120 "the blocker to reach the hold" step_at_least "$blocker" 3
swapped=$(cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/swapped.txt" \
  --steps=2 --batch_size=2 --seq_len=32 --output_dir="$WORK/out/swapped") || fail "submit swapped"
rm "$WORK/data/swapped.txt"
mkfifo "$WORK/data/swapped.txt"
cli cancel "$blocker" > /dev/null || fail "cancel blocker"
await 120 "the swapped job to end" state_is "$swapped" FAILED
cli status "$swapped" --json | jq -r .failure_reason | grep -q "swapped.txt" ||
  fail "failure reason: $(cli status "$swapped" --json | jq -r .failure_reason)"

# Point 4: a token file truncated while a job uses it does not kill the daemon.
python3 -c "import array, sys; sys.stdout.buffer.write(array.array('H', [i % 200 for i in range(200000)]).tobytes())" \
  > "$WORK/data/tokens.u16"
cat > "$WORK/tokens.json" <<JSON
{"data": {"tokenFiles": ["$WORK/data/tokens.u16"]}}
JSON
tok=$(cli submit --spec="$WORK/tokens.json" --model_config="$WORK/data/config.json" --steps=1000 \
  --batch_size=2 --seq_len=32 --output_dir="$WORK/out/tokens") || fail "submit token job"
await 120 "the token job to reach the hold" step_at_least "$tok" 3
truncate -s 0 "$WORK/data/tokens.u16"
# A checkpoint request makes the held job run more steps over the truncated file.
timeout 150 "$MEGATRAIN" --socket="$SOCKET" checkpoint "$tok" > /dev/null || true
kill -0 "$DAEMON_PID" || fail "the daemon died after the token file was truncated"
cli daemon-status > /dev/null || fail "daemon not answering after the truncation"
cli cancel "$tok" > /dev/null || true

# Point 13: a path with CR, ESC and a forged field reaches the log escaped.
set +e
cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/x$(printf '\r\033[2J')event=forged" \
  --steps=2 > /dev/null 2>&1
set -e
grep -q "rpc_error" "$WORK/daemon.log" || fail "no rpc_error line"
if LC_ALL=C grep -q "$(printf '\r')\|$(printf '\033')" "$WORK/daemon.log"; then
  fail "raw control characters in the daemon log"
fi

# Point 14: SIGHUP stops cleanly with a checkpoint of the running (held) job; exit 0.
hup=$(cli submit $(job_args) --steps=1000 --output_dir="$WORK/out/hup") || fail "submit hup"
await 120 "the hup job to reach the hold" step_at_least "$hup" 3
kill -HUP "$DAEMON_PID"
timeout 60 tail --pid="$DAEMON_PID" -f /dev/null || fail "daemon did not exit after SIGHUP"
status=0
wait "$DAEMON_PID" || status=$?
DAEMON_PID=""
[ "$status" = 0 ] || fail "SIGHUP: daemon exited with $status"
grep -q "signal=SIGHUP" "$WORK/daemon.log" || fail "SIGHUP not logged"
grep -q "interrupted by daemon shutdown" "$WORK/daemon.log" || fail "no checkpoint-and-requeue on SIGHUP"

# Point 7: a job during which the daemon dies twice (SIGKILL as a stand-in for an OOM kill or
# SIGBUS) is quarantined at the next start instead of re-run forever.
start_daemon --test_hold_after_step=3 --max_job_crashes=2
cli cancel "$hup" > /dev/null 2>&1 || true  # it resumed past the hold; it may have ended
crash=$(cli submit $(job_args) --steps=1000 --output_dir="$WORK/out/crash") || fail "submit crash"
for round in 1 2; do
  await 120 "the crash job to run (round $round)" step_at_least "$crash" 3
  kill -KILL "$DAEMON_PID"
  wait "$DAEMON_PID" 2> /dev/null || true
  DAEMON_PID=""
  start_daemon --test_hold_after_step=3 --max_job_crashes=2
done
[ "$(state "$crash")" = FAILED ] || fail "crash-looping job is $(state "$crash"), not FAILED"
cli status "$crash" --json | jq -r .failure_reason | grep -q "quarantined" || fail "no quarantine reason"
stop_daemon

# Point 6: plans beyond the machine's RAM (or the daemon's max_ram_bytes) are refused at submit.
start_daemon --max_ram_bytes=65536
expect_refused "the plan needs" submit $(job_args) --steps=2
grep -q "max_ram_bytes" "$WORK/refused.txt" || fail "refusal does not name max_ram_bytes"
cat > "$WORK/ram.json" <<JSON
{"memory": {"ramBytes": "1125899906842624"}}
JSON
expect_refused "memory.ram_bytes" submit --spec="$WORK/ram.json" $(job_args) --steps=2
stop_daemon
echo PASS
