#!/usr/bin/env bash
# Several devices in one daemon (docs/scale_out.md "Several devices in one process"): megatraind
# started with --devices=2 (the CPU device twice) trains a job with devices=2 -- each device runs
# the spec's batch -- and its final checkpoint equals, byte for byte, that of a devices=1 job
# with the accumulation doubled (batch_size 8 in micro-batches of 4), both paused at step 2 and
# resumed. `megatrain daemon-status` lists both devices. /metrics carries the per-device figures
# with a rank label until the job ends (then none are left, nor for device 1 during a devices=1
# job),
# Plan echoes the devices, `watch` follows the job as one, and devices=3 is refused naming the
# field and both numbers. A devices=2 job with executor.gradient_reduction "devices" (each
# device's sums reduce-scattered among them) ends at the same bytes; a bad value is refused.
source "$(dirname "$0")/daemon_test_lib.sh"

# spec <name> <devices> <batch_size> [executor JSON]: a job of micro-batches of 4 sequences.
spec() {
  cat > "$WORK/$1.json" <<JSON
{"name": "$1", "model": {"config_json_path": "$WORK/data/config.json"}, ${4:+"executor": $4,}
 "data": {"text_files": ["$WORK/data/corpus.txt"], "eval_every_steps": 3},
 "hyper": {"steps": 6, "batch_size": $3, "micro_batch_size": 4, "seq_len": 32,
           "lr": {"peak_lr": 0.001}},
 "devices": $2, "output_dir": "$WORK/out/$1", "seed": 5}
JSON
  echo "$WORK/$1.json"
}

# finish_through_hold <id>: the daemon holds every job at step 2; a pause (a checkpoint at step 2)
# ends the hold, and the resumed job runs past it to the end.
finish_through_hold() {
  await 120 "job $1 to reach its hold at step 2" step_at_least "$1" 2
  cli pause "$1" > /dev/null || fail "pause of $1"
  await 120 "job $1 to pause" state_is "$1" PAUSED
  cli resume "$1" > /dev/null || fail "resume of $1"
}

final_checkpoint() { ls -d "$WORK/out/$1/checkpoints"/step-* | tail -n 1; }

metrics_port=$(free_port)
start_daemon --devices=2 --threads=1 --metrics_address="127.0.0.1:$metrics_port" \
  --test_hold_after_step=2

# `megatrain daemon-status` lists both devices (index, name, arena, health), JSON too.
status=$(cli daemon-status) || fail "megatrain daemon-status"
for d in 0 1; do
  grep -q "^device $d: .* arena .* of .*  healthy$" <<< "$status" ||
    fail "megatrain daemon-status does not list device $d: $status"
done
status_json=$(cli daemon-status --json) || fail "megatrain daemon-status --json"
[ "$(jq '.devices | length' <<< "$status_json")" = 2 ] || fail "status JSON devices: $status_json"
[ "$(jq -r '.devices[1].index' <<< "$status_json")" = 1 ] || fail "device 1's index: $status_json"

plan=$(cli plan --spec="$(spec planned 2 4)" --json) || fail "plan of a devices=2 job"
[ "$(json_field "$plan" .devices)" = 2 ] || fail "Plan does not echo devices 2: $plan"

two=$(cli submit --spec="$(spec two 2 4)") || fail "submit devices=2"
await 120 "job $two to reach its hold at step 2" step_at_least "$two" 2
exposition=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics"
for rank in 0 1; do
  grep -q "^megatrain_device_stall_seconds_count{rank=\"$rank\"} [1-9]" <<< "$exposition" ||
    fail "no megatrain_device_stall_seconds for rank $rank in /metrics"
  grep -q "^megatrain_device_link_bytes_total{rank=\"$rank\"} [1-9]" <<< "$exposition" ||
    fail "no megatrain_device_link_bytes_total for rank $rank in /metrics"
done
grep -q "rank=\"2\"" <<< "$exposition" && fail "a rank 2 series for a 2-device job"
# Per-layer series stay job-wide.
grep -q '^megatrain_layer_stall_seconds_count{layer="0"}' <<< "$exposition" ||
  fail "no job-wide per-layer stall"
finish_through_hold "$two"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$two" > "$WORK/watch.txt" ||
  fail "watch of the devices=2 job: $(cat "$WORK/watch.txt")"
state_is "$two" SUCCEEDED || fail "devices=2 job ended $(job_state "$two")"
# The job's per-rank series end with it (as its per-layer ones do), before it is seen to end.
exposition=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics"
grep -q 'rank="' <<< "$exposition" && fail "per-rank series left after the devices=2 job ended"
grep -q 'layer="' <<< "$exposition" && fail "per-layer series left after the devices=2 job ended"

one=$(cli submit --spec="$(spec one 1 8)") || fail "submit devices=1"
await 120 "job $one to reach its hold at step 2" step_at_least "$one" 2
# The next job, on one device, exports no series for the device it does not use.
exposition=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics"
grep -q 'rank="1"' <<< "$exposition" && fail "a rank 1 series during a devices=1 job"
finish_through_hold "$one"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$one" > /dev/null || fail "watch devices=1"
state_is "$one" SUCCEEDED || fail "devices=1 job ended $(job_state "$one")"

# The devices' sums reduce-scattered among them (executor.gradient_reduction): one micro-batch
# per device, so the same bits again, through the same pause and resume.
reduced=$(cli submit --spec="$(spec reduced 2 4 '{"gradient_reduction": "devices"}')") ||
  fail "submit devices=2 with gradient_reduction devices"
await 120 "job $reduced to reach its hold at step 2" step_at_least "$reduced" 2
exposition=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics"
for rank in 0 1; do
  grep -q "^megatrain_device_reduce_seconds_count{rank=\"$rank\"} [1-9]" <<< "$exposition" ||
    fail "no megatrain_device_reduce_seconds for rank $rank in /metrics"
  grep -q "^megatrain_device_turn_wait_seconds_count{rank=\"$rank\"} [1-9]" <<< "$exposition" ||
    fail "no megatrain_device_turn_wait_seconds for rank $rank in /metrics"
done
# Every step of both devices went through reduce-scatters (their time is above 0).
grep -q '^megatrain_device_reduce_seconds_sum{rank="1"} 0$' <<< "$exposition" &&
  fail "rank 1 spent no time in reduce-scatters"
finish_through_hold "$reduced"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$reduced" > /dev/null ||
  fail "watch of the reduce-scatter job"
state_is "$reduced" SUCCEEDED || fail "reduce-scatter job ended $(job_state "$reduced")"
grep -q "gradient reduction: a reduce-scatter among the 2 devices (rank order)" "$WORK/daemon.log" ||
  fail "the daemon's log does not say the job reduced on the devices"

b=$(final_checkpoint one)
for job in two reduced; do
  a=$(final_checkpoint "$job")
  [ "$(basename "$a")" = "$(basename "$b")" ] || fail "final checkpoints $a and $b differ in step"
  for f in model.safetensors optimizer.safetensors trainer_state.json; do
    cmp "$a/$f" "$b/$f" || fail "$f of $job differs from devices=1 with accumulation doubled"
  done
done
expect_refused "executor.gradient_reduction" submit \
  --spec="$(spec bad_reduction 2 4 '{"gradient_reduction": "nccl"}')"

expect_refused "devices: 3 is more than the 2 device(s)" submit --spec="$(spec three 3 4)"
stop_daemon
echo PASS
