#!/usr/bin/env bash
# A real Prometheus (Debian's `prometheus`) started on loopback scrapes a real megatraind after a
# small job ran; every PromQL query of the Grafana dashboard must return data. The job streams
# its weights through a ring smaller than a layer and offloads the activations of every block
# below the top (k = 1), and /metrics shows each block's mode.
source "$(dirname "$0")/daemon_test_lib.sh"
DASHBOARD="$RUNFILES/deploy/grafana/megatrain-dashboard.json"
command -v prometheus > /dev/null || fail "prometheus is not installed (Debian package 'prometheus')"

metrics_port=$(free_port)
start_daemon --metrics_address="127.0.0.1:$metrics_port"
cat > "$WORK/spec.json" <<'JSON'
{"hyper": {"checkpointEveryLayers": 1},
 "executor": {"weightRingBytes": "65536", "activationPolicy": "offload"}}
JSON
id=$(cli submit --spec="$WORK/spec.json" --model_config="$WORK/data/config.json" \
  --text="$WORK/data/corpus.txt" --steps=8 --batch_size=2 --seq_len=32 --lr=1e-3)
timeout 120 "$MEGATRAIN" --socket="$SOCKET" watch "$id" > /dev/null || fail "job did not succeed"
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
await() {  # await <seconds> <command...>
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}
await 60 curl -sf "http://127.0.0.1:$prom_port/-/ready" -o /dev/null \
  || { tail -20 "$WORK/prometheus.log" >&2; fail "prometheus not ready"; }

has_data() {
  curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" \
    | jq -e '.status == "success" and (.data.result | length) > 0' > /dev/null
}
count=0
while IFS= read -r expr; do
  await 60 has_data "$expr" || fail "dashboard query returned no data: $expr"
  count=$((count + 1))
done < <(jq -r '.panels[].targets[].expr' "$DASHBOARD")
[ "$count" -ge 10 ] || fail "only $count dashboard queries"
# Scrape health as Prometheus sees it.
has_data 'up{job="megatraind"} == 1' || fail "target not up"
stop_daemon
echo "PASS ($count dashboard queries returned data)"
