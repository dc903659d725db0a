#!/usr/bin/env bash
# `megatrain plan` without a daemon: --offline, and the fallback when nothing answers at the
# socket, each saying so, print the same report as the daemon's Plan RPC for the same config;
# offline refusals carry the daemon's exit codes and field names.
source "$(dirname "$0")/daemon_test_lib.sh"

cat > "$WORK/daemon.textproto" <<EOF2
config_version: 1
state_dir: "$WORK/state"
socket_path: "$SOCKET"
data_roots: "$WORK/data"
output_roots: "$WORK/out"
device_arena_bytes: 67108864
pinned_budget_bytes: 1073741824
EOF2
cat > "$WORK/job.json" <<JSON
{"name": "plan", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$WORK/data/corpus.txt"]},
 "hyper": {"steps": 10, "batch_size": 4, "micro_batch_size": 2, "seq_len": 32,
           "lr": {"peak_lr": 0.001}}}
JSON

# No daemon yet: --offline, and the fallback.
cli plan --offline --daemon_config="$WORK/daemon.textproto" --spec="$WORK/job.json" \
  > "$WORK/offline.txt" || fail "plan --offline"
head -1 "$WORK/offline.txt" | grep -q "planned in-process by the engine planner (--offline)" ||
  fail "offline note: $(cat "$WORK/offline.txt")"
grep -q "parameters" "$WORK/offline.txt" || fail "offline report: $(cat "$WORK/offline.txt")"
cli plan --daemon_config="$WORK/daemon.textproto" --spec="$WORK/job.json" > "$WORK/fallback.txt" ||
  fail "plan with no daemon"
head -1 "$WORK/fallback.txt" | grep -q "no daemon answered at unix:$SOCKET" ||
  fail "fallback note: $(cat "$WORK/fallback.txt")"
cli plan --offline --daemon_config="$WORK/daemon.textproto" --spec="$WORK/job.json" --json \
  2> "$WORK/offline.err" > "$WORK/offline.json" || fail "plan --offline --json"
grep -q "planned in-process" "$WORK/offline.err" || fail "json mode note on stderr"
jq -e '.parameters | tonumber > 0' "$WORK/offline.json" > /dev/null || fail "offline json"
# Without a config: defaults, / as the root.
cli plan --offline --spec="$WORK/job.json" --json 2> /dev/null | jq -e '.parameters | tonumber > 0' \
  > /dev/null || fail "plan --offline without a daemon config"

# Offline refusals: the daemon's codes (4 = rejected) and messages.
set +e
cli plan --offline --daemon_config="$WORK/daemon.textproto" --spec="$WORK/job.json" \
  --seq_len=100000 2> "$WORK/refused.txt"; rc=$?
set -e
[ "$rc" = 4 ] || fail "an invalid spec offline should exit 4, got $rc"
grep -q "hyper.seq_len" "$WORK/refused.txt" || fail "refusal: $(cat "$WORK/refused.txt")"

# The spec's executor options reach the planner: a weight ring smaller than the two whole-layer
# slots lowers the device peak; a bad activation policy is refused naming the field.
jq '. + {"executor": {"weight_ring_bytes": "65536", "activation_policy": "adaptive"}}' \
  "$WORK/job.json" > "$WORK/ring.json"
cli plan --offline --daemon_config="$WORK/daemon.textproto" --spec="$WORK/ring.json" --json \
  2> /dev/null > "$WORK/ring_plan.json" || fail "plan --offline with a weight ring"
slots_peak=$(jq -r '.device_arena_peak_bytes' "$WORK/offline.json")
ring_peak=$(jq -r '.device_arena_peak_bytes' "$WORK/ring_plan.json")
[ "$ring_peak" -lt "$slots_peak" ] || fail "ring peak $ring_peak not below slots peak $slots_peak"
jq '. + {"executor": {"activation_policy": "sometimes"}}' "$WORK/job.json" > "$WORK/bad.json"
set +e
cli plan --offline --daemon_config="$WORK/daemon.textproto" --spec="$WORK/bad.json" \
  2> "$WORK/refused.txt"; rc=$?
set -e
[ "$rc" = 4 ] || fail "a bad activation policy offline should exit 4, got $rc"
grep -q "executor.activation_policy: 'sometimes'" "$WORK/refused.txt" ||
  fail "refusal: $(cat "$WORK/refused.txt")"

# The spec's on/off switches: unset keeps the spec's value, --zero1=false and --nozero1 turn the
# spec's true off, a bare --zero1 turns it on.
jq '. + {"hosts": ["localhost:2"], "zero1": true}' "$WORK/job.json" > "$WORK/zero1.json"
zero1_planned() {
  cli plan --offline --daemon_config="$WORK/daemon.textproto" "$@" --json 2> /dev/null |
    jq -r '.zero1 // false'
}
[ "$(zero1_planned --spec="$WORK/zero1.json")" = true ] || fail "the spec's zero1 lost"
for off in --zero1=false --nozero1; do
  [ "$(zero1_planned --spec="$WORK/zero1.json" "$off")" = false ] ||
    fail "$off did not override the spec's zero1: true"
done
[ "$(zero1_planned --spec="$WORK/job.json" --hosts=localhost:2 --zero1)" = true ] ||
  fail "a bare --zero1 did not set zero1"

# The daemon's answer under the same config is the same report.
start_daemon --config="$WORK/daemon.textproto"
cli plan --spec="$WORK/job.json" --json > "$WORK/daemon.json" || fail "plan via the daemon"
diff <(jq -S . "$WORK/daemon.json") <(jq -S . "$WORK/offline.json") ||
  fail "offline and daemon plans differ"
cli plan --spec="$WORK/job.json" | head -1 | grep -q "planned in-process" &&
  fail "the daemon's plan must not claim to be in-process"
stop_daemon
echo PASS
