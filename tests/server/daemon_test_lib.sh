# Shared helpers of the daemon shell tests: paths of the binaries, a temp workspace with a tiny
# model and text, starting/stopping megatraind with bounded waits.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD/..}/megatrain"
MEGATRAIND="$RUNFILES/server/megatraind"
MEGATRAIN="$RUNFILES/client/megatrain"
# Installed beside megatraind in production; here passed by path (a test may override it).
TOKENIZE="$RUNFILES/engine/data/megatrain_tokenize"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/daemon.XXXXXX")"
# Unix socket addresses hold ~108 bytes: the socket lives in a short private directory.
SOCKDIR="$(mktemp -d /tmp/mt-sock.XXXXXX)"
SOCKET="$SOCKDIR/s.sock"
DAEMON_PID=""

mkdir -p "$WORK/data" "$WORK/out"
cat > "$WORK/data/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 48, "intermediate_size": 96,
 "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
JSON
# A few hundred fortunes-format documents, self-contained.
for i in $(seq 1 400); do
  printf 'Document %d: the quick brown fox jumps over the lazy dog, number %d.\n%%\n' "$i" "$((i * 7))"
done > "$WORK/data/corpus.txt"

fail() { echo "FAIL: $*" >&2; [ -f "$WORK/daemon.log" ] && tail -n 40 "$WORK/daemon.log" >&2; exit 1; }

cli() { "$MEGATRAIN" --socket="$SOCKET" "$@"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_daemon [extra flags...]: starts megatraind and waits (bounded) until it answers.
start_daemon() {
  "$MEGATRAIND" --state_dir="$WORK/state" --socket_path="$SOCKET" \
    --data_roots="$WORK/data" --output_roots="$WORK/out" --device_arena_bytes=67108864 \
    --shutdown_timeout_seconds=30 --tokenize_binary="$TOKENIZE" "$@" 2>> "$WORK/daemon.log" &
  DAEMON_PID=$!
  cli --wait_seconds=20 daemon-status > /dev/null || fail "daemon did not come up"
}

# stop_daemon: SIGTERM, then a bounded wait for exit status 0.
stop_daemon() {
  kill -TERM "$DAEMON_PID"
  local status=0
  timeout 60 tail --pid="$DAEMON_PID" -f /dev/null || fail "daemon did not exit within 60 s"
  wait "$DAEMON_PID" || status=$?
  [ "$status" = 0 ] || fail "daemon exited with $status"
  DAEMON_PID=""
}

cleanup() {
  if [ -n "$DAEMON_PID" ]; then kill -KILL "$DAEMON_PID" 2>/dev/null || true; fi
  rm -rf "$SOCKDIR"
}
trap cleanup EXIT

# A job's state and step as `megatrain status --json` reports them.
job_state() { cli status "$1" --json | jq -r .state; }
job_step() { cli status "$1" --json | jq -r '.progress.step // 0'; }
state_is() { [ "$(job_state "$1")" = "$2" ]; }
step_at_least() { [ "$(job_step "$1")" -ge "$2" ]; }

# await <seconds> <description> <command...>: polls the command until it succeeds (bounded).
await() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${seconds}s waiting for $what"
    sleep 0.2
  done
}

# expect_refused <needle> <cli args...>: the command exits 4 (rejected) naming `needle`; its
# stderr stays in $WORK/refused.txt.
expect_refused() {
  local needle=$1
  shift
  set +e
  timeout 90 "$MEGATRAIN" --socket="$SOCKET" --timeout_seconds=60 "$@" > /dev/null \
    2> "$WORK/refused.txt"
  local rc=$?
  set -e
  [ "$rc" = 4 ] || fail "expected exit 4 for '$*', got $rc: $(cat "$WORK/refused.txt")"
  grep -qF -- "$needle" "$WORK/refused.txt" || fail "refusal lacks '$needle': $(cat "$WORK/refused.txt")"
}

# json_field <json> <jq filter>
json_field() { jq -r "$2" <<< "$1"; }
