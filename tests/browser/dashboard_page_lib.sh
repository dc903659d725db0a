# Shared part of the dashboard's browser tests: a real megatraind with a metrics (and dashboard)
# address, a training job long enough to watch (the tests end it), and `probe MODE`, which runs
# dashboard_probe.py in headless Chromium (Debian's `chromium`) against the page. With
# DASHBOARD_EXPOSED=1 set before sourcing, the daemon serves it exposed (TLS with a self-signed
# certificate, a token, the login form) on 127.0.0.1 (--metrics_exposed). A test may set
# DASHBOARD_DAEMON_FLAGS (more daemon flags) and define submit_dashboard_job (prints the id of
# the job to watch, submitted its own way; it must run at least until the test ends it) before
# sourcing.
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/server/daemon_test_lib.sh"
command -v "${CHROMIUM:=chromium}" > /dev/null \
  || fail "chromium is not installed (Debian package 'chromium'; scripts/setup installs it)"
export CHROMIUM HOME="$WORK/home"
mkdir -p "$HOME"
OUT="${TEST_UNDECLARED_OUTPUTS_DIR:-$WORK}"

PORT=$(free_port)
if [ "${DASHBOARD_EXPOSED:-0}" = 1 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -addext "subjectAltName=IP:127.0.0.1" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2> /dev/null \
    || fail "openssl could not make a certificate"
  export DASHBOARD_TOKEN=$(openssl rand -hex 24)
  printf '%s\n' "$DASHBOARD_TOKEN" > "$WORK/token"
  DASHBOARD_FLAGS=(--metrics_address="127.0.0.1:$PORT" --metrics_exposed
                   --tls_cert_file="$WORK/cert.pem" --tls_key_file="$WORK/key.pem"
                   --token_file="$WORK/token")
  PAGE_URL="https://127.0.0.1:$PORT/login"
  PAGE_CURL=(--cacert "$WORK/cert.pem" -H "Authorization: Bearer $DASHBOARD_TOKEN")
  BASE_URL="https://127.0.0.1:$PORT"
else
  DASHBOARD_FLAGS=(--metrics_address="127.0.0.1:$PORT")
  PAGE_URL="http://127.0.0.1:$PORT/"
  PAGE_CURL=()
  BASE_URL="http://127.0.0.1:$PORT"
fi
DASHBOARD_FLAGS+=(${DASHBOARD_DAEMON_FLAGS[@]+"${DASHBOARD_DAEMON_FLAGS[@]}"})
start_daemon "${DASHBOARD_FLAGS[@]}"
curl -sf "${PAGE_CURL[@]}" "$BASE_URL/" | grep '<script src="dashboard.js">' > /dev/null || fail "no dashboard page"
if declare -F submit_dashboard_job > /dev/null; then
  JOB=$(submit_dashboard_job) || fail "submit the job to watch"
else
  JOB=$(cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/corpus.txt" \
    --steps=1000000 --batch_size=2 --seq_len=32 --lr=1e-3)
fi
await 120 "job $JOB running" state_is "$JOB" RUNNING
await 120 "job $JOB's first step" step_at_least "$JOB" 1

# probe MODE [DIR]: the page checks of dashboard_probe.py (3 = the test model's layers); its
# signal files go to DIR ($OUT by default).
probe() {
  python3 "$RUNFILES/tests/browser/dashboard_probe.py" "$1" "$PAGE_URL" "$JOB" 3 \
    "$DAEMON_PID" "${2:-$OUT}" > "$WORK/probe.json" || fail "dashboard probe ($1) failed"
}
