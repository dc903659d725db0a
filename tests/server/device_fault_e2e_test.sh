#!/usr/bin/env bash
# A device fault through the real device and executor: megatraind's test hook faults its one CPU
# device after 402 training steps (over all jobs). The first job (400 steps) succeeds on that
# device; the second fails at its third step with the device error; the daemon then reports
# itself unhealthy (daemon-status, its device's entry and the health metric), refuses new jobs,
# keeps the queued job queued and keeps serving until SIGTERM, after which it exits cleanly.
#
# No step of this test depends on how fast the machine is (issue 16, point 16): every check
# waits for a state. The second and third jobs are queued behind a "gate" job whose run waits in
# a stand-in tokenizer until the test cancels it, so both are queued when the second starts.
source "$(dirname "$0")/daemon_test_lib.sh"

port=$(free_port)
# The gate: a stand-in for megatrain_tokenize that waits on the gate job's SentencePiece model
# (the daemon kills it on cancel) and runs the real tool for the byte-tokenizer jobs.
cat > "$WORK/gate_tokenizer.sh" <<SH
#!/bin/sh
case " \$* " in *" --tokenizer=bytes "*) exec "$TOKENIZE" "\$@" ;; esac
exec sleep 600
SH
chmod +x "$WORK/gate_tokenizer.sh"
echo "not a real model" > "$WORK/data/gate.model"
start_daemon --inject_device_fault_after_steps=402 --metrics_address="127.0.0.1:$port" \
  --tokenize_binary="$WORK/gate_tokenizer.sh"
cat > "$WORK/job.json" <<JSON
{"name": "fault", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$WORK/data/corpus.txt"]},
 "hyper": {"steps": 400, "batch_size": 2, "seq_len": 32, "lr": {"peak_lr": 0.001}},
 "seed": 5}
JSON
cat > "$WORK/gate.json" <<JSON
{"name": "gate", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$WORK/data/corpus.txt"], "tokenizer": "$WORK/data/gate.model"},
 "hyper": {"steps": 4, "batch_size": 2, "seq_len": 32, "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/gate"}
JSON
cli daemon-status --json | jq -e '.healthy == true' > /dev/null || fail "unhealthy at start"
first=$(cli submit --spec="$WORK/job.json" --output_dir="$WORK/out/first") || fail "submit first"
timeout 120 "$MEGATRAIN" --socket="$SOCKET" watch "$first" > /dev/null || fail "first job failed"
# 400 of the 402 steps are done: still healthy, whatever the machine's speed.
cli daemon-status --json | jq -e '.healthy == true' > /dev/null || fail "unhealthy too early"
gate=$(cli submit --spec="$WORK/gate.json") || fail "submit gate"
second=$(cli submit --spec="$WORK/job.json" --steps=50 --output_dir="$WORK/out/second") ||
  fail "submit second"
queued=$(cli submit --spec="$WORK/job.json" --steps=4 --output_dir="$WORK/out/queued") ||
  fail "submit queued"
[ "$(cli status "$second" --json | jq -r .state)" = QUEUED ] || fail "second job not queued"
cli cancel "$gate" > /dev/null || fail "cancel gate"
set +e
timeout 120 "$MEGATRAIN" --socket="$SOCKET" watch "$second" > "$WORK/watch.txt"; rc=$?
set -e
[ "$rc" = 1 ] || fail "watch of the faulted job should exit 1, got $rc"
job=$(cli status "$second" --json)
[ "$(json_field "$job" .state)" = FAILED ] || fail "second job: $job"
json_field "$job" .failure_reason | grep -q "device fault: injected by --inject_device_fault_after_steps=402" ||
  fail "failure reason: $job"
[ "$(json_field "$job" .progress.step)" = 2 ] || fail "the fault should hit step 3: $job"

status=$(cli daemon-status --json)
[ "$(json_field "$status" .healthy)" = false ] || fail "daemon still healthy: $status"
json_field "$status" .unhealthy_reason | grep -q "device fault" || fail "reason: $status"
# The device itself says so in DaemonStatus.devices (its sticky fault).
[ "$(jq '.devices | length' <<< "$status")" = 1 ] || fail "one device expected: $status"
[ "$(jq -r '.devices[0].healthy' <<< "$status")" = false ] || fail "device 0 healthy: $status"
jq -r '.devices[0].unhealthy_reason' <<< "$status" | grep -q "injected by" ||
  fail "device 0's fault: $status"
[ "$(cli status "$queued" --json | jq -r .state)" = QUEUED ] || fail "queued job did not stay queued"
set +e
cli submit --spec="$WORK/job.json" --output_dir="$WORK/out/refused" 2> "$WORK/refused.txt"; rc=$?
set -e
[ "$rc" = 4 ] || fail "a submit to an unhealthy daemon should exit 4 (FAILED_PRECONDITION), got $rc"
grep -q "unhealthy" "$WORK/refused.txt" || fail "refusal message: $(cat "$WORK/refused.txt")"
metrics=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "metrics endpoint"
grep -q "^megatrain_daemon_healthy 0" <<< "$metrics" || fail "health metric not 0"
kill -0 "$DAEMON_PID" || fail "daemon died"
stop_daemon
echo PASS
