#!/usr/bin/env bash
# A real Prometheus (Debian's `prometheus`) started on loopback scrapes a real megatraind while a
# small job runs; every PromQL query of the Grafana dashboard must return data. The job streams
# its weights through a ring smaller than a layer and offloads the activations of every block
# below the top (k = 1), and /metrics shows each block's mode. When the job ends its per-layer
# series go; a request that trickles in is closed at the daemon's request deadline.
source "$(dirname "$0")/daemon_test_lib.sh"
DASHBOARD="$RUNFILES/deploy/grafana/megatrain-dashboard.json"
command -v prometheus > /dev/null || fail "prometheus is not installed (Debian package 'prometheus')"

metrics_port=$(free_port)
# The job holds at step 4 (a state, whatever the machine's speed) while Prometheus scrapes it;
# its per-layer series must go when it ends.
start_daemon --metrics_address="127.0.0.1:$metrics_port" --test_hold_after_step=4
cat > "$WORK/spec.json" <<'JSON'
{"hyper": {"checkpointEveryLayers": 1},
 "executor": {"weightRingBytes": "65536", "activationPolicy": "offload"}}
JSON
id=$(cli submit --spec="$WORK/spec.json" --model_config="$WORK/data/config.json" \
  --text="$WORK/data/corpus.txt" --steps=8 --batch_size=2 --seq_len=32 --lr=1e-3)
deadline=$((SECONDS + 120))
until [ "$(cli status "$id" --json | jq -r '.progress.step // 0')" -ge 4 ]; do
  [ "$(cli status "$id" --json | jq -r .state)" != FAILED ] || fail "job failed"
  [ "$SECONDS" -lt "$deadline" ] || fail "job did not reach its hold at step 4"
  sleep 0.2
done
exposition=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics"
grep -q '^megatrain_layer_compute_seconds_bucket{.*layer="2"' <<< "$exposition" \
  || fail "daemon does not expose per-layer histograms"
# Three blocks of one layer: the two below the top offload, the top one keeps.
for expected in 'block="0",mode="offload"} 1' 'block="1",mode="offload"} 1' \
  'block="2",mode="keep"} 1' 'block="0",mode="recompute"} 0'; do
  grep -qF "megatrain_activation_block_mode{$expected" <<< "$exposition" \
    || fail "no megatrain_activation_block_mode{$expected in /metrics"
done
grep -q 'activation_modes.*0:offload 1:offload 2:keep' "$WORK/daemon.log" \
  || fail "no activation_modes job event"

prom_port=$(free_port)
cat > "$WORK/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: megatraind
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
YML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prom" \
  --web.listen-address="127.0.0.1:$prom_port" > "$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
trap 'kill -TERM $PROM_PID 2>/dev/null || true; cleanup' EXIT

# Bounded polling of a condition (Prometheus has no readiness callback).
poll_until() {  # poll_until <seconds> <command...>: 1 when the bound passes
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}
poll_until 60 curl -sf "http://127.0.0.1:$prom_port/-/ready" -o /dev/null \
  || { tail -20 "$WORK/prometheus.log" >&2; fail "prometheus not ready"; }

has_data() {
  curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" \
    | jq -e '.status == "success" and (.data.result | length) > 0' > /dev/null
}
count=0
while IFS= read -r expr; do
  poll_until 60 has_data "$expr" || fail "dashboard query returned no data: $expr"
  count=$((count + 1))
done < <(jq -r '.panels[].targets[].expr' "$DASHBOARD")
[ "$count" -ge 10 ] || fail "only $count dashboard queries"
# Scrape health as Prometheus sees it.
has_data 'up{job="megatraind"} == 1' || fail "target not up"

# Issue 16, point 9: the job's per-layer and per-block label sets are removed when it ends.
cli cancel "$id" > /dev/null || fail "cancel"
timeout 120 "$MEGATRAIN" --socket="$SOCKET" watch "$id" > /dev/null && fail "cancelled job succeeded"
[ "$(cli status "$id" --json | jq -r .state)" = CANCELLED ] || fail "job not cancelled"
exposition=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics after the job"
if grep -q 'layer="\|block="' <<< "$exposition"; then
  fail "per-layer series outlive the job: $(grep -m3 'layer="\|block="' <<< "$exposition")"
fi
grep -q '^megatrain_train_steps_total' <<< "$exposition" || fail "daemon-wide series gone"

# Issue 16, point 9: a request that trickles in (a byte every 200 ms, never ending) is closed by
# the daemon at its whole-request deadline (5 s); the wait is for the close, bounded at 60 s.
python3 - "$metrics_port" <<'PY' || fail "the daemon kept a trickling request open"
import select, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if select.select([s], [], [], 0.2)[0]:
        try:
            if not s.recv(4096):
                sys.exit(0)  # closed by the daemon
        except ConnectionResetError:
            sys.exit(0)
    try:
        s.send(b"a")
    except (BrokenPipeError, ConnectionResetError):
        sys.exit(0)
sys.exit(1)
PY
curl -sf "http://127.0.0.1:$metrics_port/metrics" -o /dev/null || fail "no /metrics after the trickle"
stop_daemon
echo "PASS ($count dashboard queries returned data)"
