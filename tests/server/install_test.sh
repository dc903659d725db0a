#!/usr/bin/env bash
# scripts/install into a temporary root: files land where the unit expects them, the unit passes
# `systemd-analyze verify`, the daemon's signing key is created once (0600), the installed
# example config starts the installed daemon, which finds megatrain_tokenize beside itself and
# runs a job whose text uses a SentencePiece model, and finds megatrain_chat_tokenize beside
# itself (installed with scripts/setup's venv, --hf-venv) and runs a chat job.
source "$(dirname "$0")/daemon_test_lib.sh"
# The runfiles link back into the source tree, where scripts/install lives.
repo="$(cd "$(dirname "$(readlink -f "$RUNFILES/deploy/megatraind.service")")/.." && pwd)"
[ -x "$repo/scripts/install" ] || fail "scripts/install not found from $repo"
mkdir -p "$WORK/bin"
cp "$MEGATRAIND" "$RUNFILES/server/megatrain_rank" "$MEGATRAIN" "$RUNFILES/engine/data/megatrain_tokenize" \
  "$WORK/bin/"
# scripts/setup's venv (@hf_venv//:python_path names its Python); the test fails without it.
venv_python="$(cat "$RUNFILES/../hf_venv/python_path")"
[ -x "$venv_python" ] || fail "no HF venv at $venv_python: run scripts/setup"
hf_venv="$(dirname "$(dirname "$venv_python")")"
R="$WORK/root"
"$repo/scripts/install" --prefix="$R/usr" --sysconfdir="$R/etc" --statedir="$R/var/lib" \
  --bin-dir="$WORK/bin" --hf-venv="$hf_venv" --no-user > "$WORK/install.log" 2>&1 ||
  fail "install: $(cat "$WORK/install.log")"
unit="$R/usr/lib/systemd/system/megatraind.service"
for f in "$R/usr/bin/megatraind" "$R/usr/bin/megatrain" "$R/usr/bin/megatrain_tokenize" "$unit" \
  "$R/usr/bin/megatrain_rank" \
  "$R/usr/bin/megatrain_chat_tokenize" "$R/usr/lib/megatrain/hf_chat/hf_chat/cli.py" \
  "$R/usr/lib/megatrain/hf-venv/bin/python" \
  "$R/etc/megatrain/megatraind.textproto" "$R/usr/lib/sysusers.d/megatrain.conf" \
  "$R/usr/share/megatrain/grafana/megatrain-dashboard.json" \
  "$R/usr/share/megatrain/prometheus/megatrain-scrape.yml"; do
  [ -e "$f" ] || fail "missing $f"
done
[ -d "$R/var/lib/megatrain/outputs" ] || fail "no outputs dir"
[ "$(stat -c %a "$R/var/lib/megatrain/signing_key")" = 600 ] || fail "signing_key not created 0600"
installed_key=$(tr -d '[:space:]' < "$R/var/lib/megatrain/signing_key.pub")
[ "${#installed_key}" = 64 ] || fail "signing_key.pub holds '$installed_key'"
grep -q "^ExecStart=$R/usr/bin/megatraind --config=$R/etc/megatrain/megatraind.textproto$" "$unit" \
  || fail "ExecStart not substituted: $(grep ExecStart "$unit")"
for key in "LimitMEMLOCK=infinity" "StateDirectory=megatrain" "RuntimeDirectory=megatrain" \
  "Restart=on-failure" "ProtectSystem=strict" "NoNewPrivileges=yes" "User=megatrain" \
  "Type=notify" "NotifyAccess=main" "WatchdogSec=60s"; do
  grep -q "^$key" "$unit" || fail "unit lacks $key"
done
systemd-analyze verify "$unit" > "$WORK/verify.log" 2>&1 || fail "verify: $(cat "$WORK/verify.log")"
[ ! -s "$WORK/verify.log" ] || fail "verify warnings: $(cat "$WORK/verify.log")"

# run_job NAME SPEC SECONDS: submits SPEC, watches it end (bounded) and prints the job's id.
run_job() {
  local id
  id=$(cli submit --spec="$2") || fail "submit the $1 job"
  timeout "$3" "$MEGATRAIN" --socket="$SOCKET" watch "$id" > "$WORK/$1_watch.txt" ||
    fail "$1 job: $(cli status "$id")"
  echo "$id"
}

# The installed example config parses and validates; paths are overridden for the test.
MEGATRAIND="$R/usr/bin/megatraind"
start_daemon --config="$R/etc/megatrain/megatraind.textproto" --metrics_address="127.0.0.1:$(free_port)"
cli daemon-status --json | jq -e '.healthy and .device == "cpu"' > /dev/null || fail "status"
grep -q tokenize_binary_missing "$WORK/daemon.log" && fail "megatrain_tokenize not found beside megatraind"
cp "$RUNFILES/tests/server/sp_fixture.model" "$RUNFILES/tests/server/sp_fixture_corpus.txt" "$WORK/data/"
cat > "$WORK/sp_job.json" <<JSON
{"name": "sp", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$WORK/data/sp_fixture_corpus.txt"], "tokenizer": "$WORK/data/sp_fixture.model"},
 "hyper": {"steps": 3, "batch_size": 2, "seq_len": 32, "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/sp"}
JSON
run_job sentencepiece "$WORK/sp_job.json" 120 > /dev/null || exit 1
ls "$WORK"/out/sp/tokens/*.u16 > /dev/null || fail "no token file in $WORK/out/sp/tokens"

# A chat job on the installed daemon: its default --chat_tokenize_binary is the installed
# megatrain_chat_tokenize beside megatraind, which runs in the installed venv link. The HF model
# directory: a one-step job's weights (vocab 640, above the fixture tokenizer's 600) and a tiny
# Llama-3-style tokenizer with its chat template (tests/python/hf_chat_fixtures.py).
grep -q chat_tokenizer_missing "$WORK/daemon.log" &&
  fail "megatrain_chat_tokenize not found beside megatraind"
cat > "$WORK/data/chat_model.json" <<'JSON'
{"model_type": "llama", "vocab_size": 640, "hidden_size": 48, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
JSON
cat > "$WORK/init_job.json" <<JSON
{"name": "init", "model": {"config_json_path": "$WORK/data/chat_model.json"},
 "data": {"text_files": ["$WORK/data/corpus.txt"]},
 "hyper": {"steps": 1, "batch_size": 2, "seq_len": 32, "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/init"}
JSON
init=$(run_job init "$WORK/init_job.json" 120) || exit 1
checkpoint=$(cli status "$init" --json | jq -r '.progress.last_checkpoint // ""')
[ -n "$checkpoint" ] || fail "the init job wrote no checkpoint: $(cli status "$init")"
mkdir -p "$WORK/data/hf"
cp "$checkpoint/config.json" "$checkpoint/model.safetensors" "$WORK/data/hf/"
"$venv_python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import hf_chat_fixtures as f;
f.make_llama3(sys.argv[2])' "$RUNFILES/tests/python" "$WORK/data/hf" || fail "hf_chat_fixtures"
for i in $(seq 1 48); do
  printf '{"messages": [{"role": "user", "content": "Summarize the text, please (%d)."}, ' "$i"
  printf '{"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."}]}\n'
done > "$WORK/data/chat.jsonl"
cat > "$WORK/chat_job.json" <<JSON
{"name": "chat", "model": {"hf_directory": "$WORK/data/hf"},
 "data": {"chat_files": ["$WORK/data/chat.jsonl"], "validation_fraction": 0.125,
          "eval_windows": 2},
 "hyper": {"steps": 2, "batch_size": 2, "seq_len": 128, "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/chat"}
JSON
chat=$(run_job chat "$WORK/chat_job.json" 180) || exit 1
[ "$(job_state "$chat")" = SUCCEEDED ] || fail "chat job: $(cli status "$chat")"
ls "$WORK"/out/chat/tokens/*.mtsft > /dev/null || fail "no sample file in $WORK/out/chat/tokens"
stop_daemon
# Installing again keeps an edited config and drops the example beside it.
echo "# edited" >> "$R/etc/megatrain/megatraind.textproto"
"$repo/scripts/install" --prefix="$R/usr" --sysconfdir="$R/etc" --statedir="$R/var/lib" \
  --bin-dir="$WORK/bin" --hf-venv="$hf_venv" --no-user > /dev/null
grep -q "# edited" "$R/etc/megatrain/megatraind.textproto" || fail "config overwritten"
[ "$(tr -d '[:space:]' < "$R/var/lib/megatrain/signing_key.pub")" = "$installed_key" ] ||
  fail "installing again replaced the signing key"
[ -f "$R/etc/megatrain/megatraind.textproto.example" ] || fail "no .example"
echo PASS
