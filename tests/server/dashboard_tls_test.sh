#!/usr/bin/env bash
# The metrics/dashboard listener exposed (TLS + token), tested on 127.0.0.1 with
# --metrics_exposed, which applies the exposed rules to a loopback address: a real megatraind
# with a self-signed certificate and a token file, real clients (curl, Python ssl, Prometheus).
# Refused at start without TLS or token (naming the field); no token / a wrong token -> 401 on
# /metrics, /api/jobs and the page, logged with the peer; the right one -> 200; plain HTTP to
# the TLS port gets no answer; the login form's cookie works, a forged one and one from before a
# restart do not; a foreign Host is 403; Prometheus scrapes over TLS with the bearer token;
# stalled handshakes are closed at the request deadline; /api/events delivers a later training
# step's event and caps concurrent streams.
source "$(dirname "$0")/daemon_test_lib.sh"
CLIENT="$RUNFILES/tests/server/dashboard_tls_client.py"
command -v prometheus > /dev/null || fail "prometheus is not installed (Debian package 'prometheus')"

CERT="$WORK/cert.pem" KEY="$WORK/key.pem" TOKEN_FILE="$WORK/token"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" -keyout "$KEY" -out "$CERT" 2> /dev/null \
  || fail "openssl could not make a certificate"
TOKEN=$(openssl rand -hex 24)
printf '%s\n' "$TOKEN" > "$TOKEN_FILE"
chmod 600 "$KEY" "$TOKEN_FILE"

# Refused at start, naming the field: exposed without TLS, exposed without a token.
expect_start_refused() {  # expect_start_refused <needle> <flags...>
  local needle=$1
  shift
  local status=0
  timeout 60 "$MEGATRAIND" --state_dir="$WORK/refused" --socket_path="$SOCKDIR/r.sock" \
    --data_roots="$WORK/data" --output_roots="$WORK/out" "$@" > /dev/null 2> "$WORK/refused.txt" \
    || status=$?
  [ "$status" != 0 ] || fail "megatraind started with $*"
  grep -q -- "$needle" "$WORK/refused.txt" || fail "refusal of $* does not name $needle: $(cat "$WORK/refused.txt")"
}
expect_start_refused "metrics_address.*tls_cert_file" --metrics_address=0.0.0.0:1
expect_start_refused "metrics_exposed.*tls_cert_file" --metrics_address=127.0.0.1:1 --metrics_exposed
expect_start_refused "metrics_address.*token_file" --metrics_address=0.0.0.0:1 \
  --tls_cert_file="$CERT" --tls_key_file="$KEY"

PORT=$(free_port)
BASE="https://127.0.0.1:$PORT"
EXPOSED=(--metrics_address="127.0.0.1:$PORT" --metrics_exposed --tls_cert_file="$CERT"
         --tls_key_file="$KEY" --token_file="$TOKEN_FILE" --dashboard_host_names=trainer.example)
start_daemon "${EXPOSED[@]}"
JOB=$(cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/corpus.txt" \
  --steps=1000000 --batch_size=2 --seq_len=32 --lr=1e-3)
await 120 "job $JOB running" state_is "$JOB" RUNNING

code() { curl -s -o /dev/null -w '%{http_code}' --cacert "$CERT" "$@" || true; }
for path in /metrics /api/jobs / /dashboard.js /api/events /nothing; do
  [ "$(code "$BASE$path")" = 401 ] || fail "no token: $path not 401"
  [ "$(code -H "Authorization: Bearer wrong-$TOKEN" "$BASE$path")" = 401 ] \
    || fail "wrong token: $path not 401"
done
[ "$(code -H "Authorization: Bearer $TOKEN" "$BASE/api/jobs")" = 200 ] || fail "token: /api/jobs"
# (grep reads the whole body: with pipefail, grep -q could make curl fail on SIGPIPE.)
curl -sf --cacert "$CERT" -H "Authorization: Bearer $TOKEN" "$BASE/metrics" \
  | grep "^megatrain_daemon_healthy 1" > /dev/null || fail "token: no megatrain metric in /metrics"
curl -sf --cacert "$CERT" -H "Authorization: Bearer $TOKEN" "$BASE/api/jobs" \
  | jq -e --arg id "$JOB" '.jobs | map(.id) | index($id) != null' > /dev/null \
  || fail "token: $JOB not in /api/jobs"
grep -q 'event=http_unauthorized peer=127.0.0.1:[0-9]* target=/metrics' "$WORK/daemon.log" \
  || fail "no http_unauthorized log line with the peer"
grep -q "$TOKEN" "$WORK/daemon.log" && fail "the token reached the log"
# A foreign Host (DNS rebinding) is refused even with the token; the configured name passes.
[ "$(code -H "Authorization: Bearer $TOKEN" -H "Host: evil.example" "$BASE/api/jobs")" = 403 ] \
  || fail "foreign Host not 403"
[ "$(code -H "Authorization: Bearer $TOKEN" -H "Host: trainer.example:$PORT" "$BASE/api/jobs")" = 200 ] \
  || fail "configured Host name refused"
# Plain HTTP to the TLS port gets no HTTP answer; TLS below 1.2 is refused.
if curl -s -o /dev/null --max-time 30 "http://127.0.0.1:$PORT/metrics"; then
  fail "plain HTTP to the TLS port was answered"
fi
# (The client's security level 0 lets it offer TLS 1.1; the refusal is the daemon's.)
if openssl s_client -connect "127.0.0.1:$PORT" -tls1_1 -cipher 'DEFAULT:@SECLEVEL=0' \
    -CAfile "$CERT" < /dev/null > /dev/null 2>&1; then
  fail "a TLS 1.1 handshake succeeded"
fi

# The login flow: the form, a wrong token (401), the right one (a strict session cookie).
curl -sf --cacert "$CERT" "$BASE/login" | grep 'type="password" name="token"' > /dev/null || fail "no login form"
[ "$(code --data-urlencode "token=wrong" "$BASE/login")" = 401 ] || fail "wrong login not 401"
grep -q 'event=http_login_refused peer=127.0.0.1:' "$WORK/daemon.log" || fail "no http_login_refused log line"
curl -s --cacert "$CERT" -D "$WORK/login.head" -o /dev/null --data-urlencode "token=$TOKEN" "$BASE/login"
grep -q '^HTTP/1.1 303' "$WORK/login.head" || fail "login: $(head -1 "$WORK/login.head")"
set_cookie=$(grep -i '^Set-Cookie:' "$WORK/login.head" | tr -d '\r')
for attribute in "; Secure" "; HttpOnly" "; SameSite=Strict" "; Path=/"; do
  grep -qF -- "$attribute" <<< "$set_cookie" || fail "session cookie lacks '$attribute': $set_cookie"
done
COOKIE=$(sed -E 's/^[^:]*: *([^;]*);.*/\1/' <<< "$set_cookie")
[[ "$COOKIE" =~ ^megatrain_session=[0-9a-f]{64}$ ]] || fail "odd session cookie '$COOKIE'"
grep -q 'event=http_login peer=127.0.0.1:' "$WORK/daemon.log" || fail "no http_login log line"
[ "$(code -H "Cookie: $COOKIE" "$BASE/api/jobs")" = 200 ] || fail "session cookie refused"
[ "$(code -H "Cookie: $COOKIE" "$BASE/")" = 200 ] || fail "session cookie refused for the page"
FORGED="${COOKIE%?}$([ "${COOKIE: -1}" = 0 ] && echo 1 || echo 0)"
[ "$(code -H "Cookie: $FORGED" "$BASE/api/jobs")" = 401 ] || fail "forged cookie accepted"
[ "$(code -H "Cookie: megatrain_session=" "$BASE/api/jobs")" = 401 ] || fail "empty cookie accepted"

# A real Prometheus scrapes over TLS with the bearer token.
prom_port=$(free_port)
cat > "$WORK/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: megatraind
    scheme: https
    authorization:
      credentials_file: $TOKEN_FILE
    tls_config:
      ca_file: $CERT
    static_configs:
      - targets: ["127.0.0.1:$PORT"]
YML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prom" \
  --web.listen-address="127.0.0.1:$prom_port" > "$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
trap 'kill -TERM $PROM_PID 2>/dev/null || true; cleanup' EXIT
has_data() {
  curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" \
    | jq -e '.status == "success" and (.data.result | length) > 0' > /dev/null
}
# Bounded polling (Prometheus has no readiness callback).
await 90 "Prometheus to scrape megatraind over TLS" has_data 'up{job="megatraind"} == 1'
await 60 "a megatrain metric in Prometheus" has_data 'megatrain_daemon_healthy{job="megatraind"} == 1'
kill -TERM "$PROM_PID"

# Stalled handshakes are closed at the request deadline; the listener serves afterwards.
python3 "$CLIENT" stall "$PORT" || fail "stalled handshakes"
[ "$(code -H "Authorization: Bearer $TOKEN" "$BASE/api/jobs")" = 200 ] || fail "no answer after the stalls"

# Server-sent events: the stream cap (the default 2), then a later step's event.
python3 "$CLIENT" cap "$PORT" "$CERT" "$TOKEN" 2 || fail "event stream cap"
python3 "$CLIENT" events "$PORT" "$CERT" "$TOKEN" "$JOB" || fail "event stream"

# Sessions live in the daemon's memory: a restart ends them.
cli cancel "$JOB" > /dev/null || fail "cancel"
await 120 "job $JOB cancelled" state_is "$JOB" CANCELLED
stop_daemon
start_daemon "${EXPOSED[@]}"
[ "$(code -H "Cookie: $COOKIE" "$BASE/api/jobs")" = 401 ] || fail "a session outlived the restart"
[ "$(code -H "Authorization: Bearer $TOKEN" "$BASE/api/jobs")" = 200 ] || fail "token after restart"
stop_daemon
echo "PASS"
