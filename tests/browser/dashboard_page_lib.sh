# Shared part of the dashboard's browser tests: a real megatraind with a metrics (and dashboard)
# address, a training job long enough to watch (the tests end it), and `probe MODE`, which runs
# dashboard_probe.py in headless Chromium (Debian's `chromium`) against the page.
source "${TEST_SRCDIR:-$PWD/..}/megatrain/tests/server/daemon_test_lib.sh"
command -v "${CHROMIUM:=chromium}" > /dev/null \
  || fail "chromium is not installed (Debian package 'chromium'; scripts/setup installs it)"
export CHROMIUM HOME="$WORK/home"
mkdir -p "$HOME"
OUT="${TEST_UNDECLARED_OUTPUTS_DIR:-$WORK}"

PORT=$(free_port)
start_daemon --metrics_address="127.0.0.1:$PORT"
curl -sf "http://127.0.0.1:$PORT/" | grep -q '<script src="dashboard.js">' || fail "no dashboard page"
JOB=$(cli submit --model_config="$WORK/data/config.json" --text="$WORK/data/corpus.txt" \
  --steps=1000000 --batch_size=2 --seq_len=32 --lr=1e-3)
await 120 "job $JOB running" state_is "$JOB" RUNNING
await 120 "job $JOB's first step" step_at_least "$JOB" 1

# probe MODE [DIR]: the page checks of dashboard_probe.py (3 = the test model's layers); its
# signal files go to DIR ($OUT by default).
probe() {
  python3 "$RUNFILES/tests/browser/dashboard_probe.py" "$1" "http://127.0.0.1:$PORT/" "$JOB" 3 \
    "$DAEMON_PID" "${2:-$OUT}" > "$WORK/probe.json" || fail "dashboard probe ($1) failed"
}
