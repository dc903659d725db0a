#!/usr/bin/env bash
# A fine-tuning job's eval replies (data.eval_prompts) on the dashboard in a real browser: a chat
# job on a tiny HF-style model (a one-step text job's weights and the Llama-3-style fixture
# tokenizer of tests/python/hf_chat_fixtures.py) replies to two prompts every 2 steps, one of them
# HTML. The page must show a round, then a later one without a reload, each prompt as text (the
# HTML never becomes elements); once the job is paused, exactly the daemon's last round
# (dashboard_probe.py eval_replies). A screenshot goes to the test's undeclared outputs.
RUNFILES="${TEST_SRCDIR:-$PWD/..}/megatrain"
DASHBOARD_DAEMON_FLAGS=(--chat_tokenize_binary="$RUNFILES/tools/hf_chat/megatrain_chat_tokenize")
export EVAL_PROMPTS_JSON='["Summarize the text, please.", "<b id=\"injected\">bold</b> <img src=x onerror=\"document.body.dataset.pwned=1\"> & \"quoted\""]'

# The chat job (run inside dashboard_page_lib.sh, after the daemon starts): prints its id.
submit_dashboard_job() {
  cat > "$WORK/data/chat_model.json" <<'JSON'
{"model_type": "llama", "vocab_size": 640, "hidden_size": 48, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
JSON
  local init checkpoint venv_python
  init=$(cli submit --model_config="$WORK/data/chat_model.json" --text="$WORK/data/corpus.txt" \
    --steps=1 --batch_size=2 --seq_len=32 --lr=1e-3) || fail "submit the init job"
  await 120 "the init job $init" state_is "$init" SUCCEEDED
  checkpoint=$(cli status "$init" --json | jq -r '.progress.last_checkpoint // ""')
  [ -n "$checkpoint" ] || fail "the init job wrote no checkpoint: $(cli status "$init")"
  mkdir -p "$WORK/data/hf"
  cp "$checkpoint/config.json" "$checkpoint/model.safetensors" "$WORK/data/hf/"
  venv_python="$(cat "$RUNFILES/../hf_venv/python_path")"
  "$venv_python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import hf_chat_fixtures as f;
f.make_llama3(sys.argv[2])' "$RUNFILES/tests/python" "$WORK/data/hf" > /dev/null ||
    fail "hf_chat_fixtures (run scripts/setup: it creates the venv)"
  for i in $(seq 1 48); do
    printf '{"messages": [{"role": "user", "content": "Summarize the text, please (%d)."}, ' "$i"
    printf '{"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."}]}\n'
  done > "$WORK/data/chat.jsonl"
  cat > "$WORK/chat_job.json" <<JSON
{"name": "chat", "model": {"hf_directory": "$WORK/data/hf"},
 "data": {"chat_files": ["$WORK/data/chat.jsonl"], "validation_fraction": 0.125,
          "eval_windows": 2, "eval_every_steps": 2, "eval_reply_tokens": 8,
          "eval_prompts": $EVAL_PROMPTS_JSON},
 "hyper": {"steps": 1000000, "batch_size": 2, "seq_len": 128, "lr": {"peak_lr": 0.001}},
 "output_dir": "$WORK/out/chat"}
JSON
  cli submit --spec="$WORK/chat_job.json"
}

source "$RUNFILES/tests/browser/dashboard_page_lib.sh"
mkdir -p "$WORK/signals"
probe eval_replies "$WORK/signals" &
probe_pid=$!
seen() { [ -e "$WORK/signals/seen_live" ] || ! kill -0 "$probe_pid" 2> /dev/null; }
await 240 "the probe to see two rounds of replies" seen
[ -e "$WORK/signals/seen_live" ] || { wait "$probe_pid"; fail "the probe ended early"; }
# Paused, the job's last round is fixed: the page must show exactly the daemon's.
cli pause "$JOB" > /dev/null || fail "pause"
await 120 "job $JOB paused" state_is "$JOB" PAUSED
curl -sf "http://127.0.0.1:$PORT/api/jobs/$JOB" |
  jq -c '.history.eval_replies | {step: .[0].step, replies: [.[] | [.prompt, .reply]]}' \
  > "$WORK/signals/expected.tmp" || fail "no eval replies in /api/jobs/$JOB"
mv "$WORK/signals/expected.tmp" "$WORK/signals/expected.json"
wait "$probe_pid" || fail "the page did not show the daemon's last round"
cli cancel "$JOB" > /dev/null || fail "cancel"
await 120 "job $JOB cancelled" state_is "$JOB" CANCELLED
stop_daemon
cp "$WORK/signals/"*.png "$OUT/" 2> /dev/null || true
echo "PASS $(cat "$WORK/probe.json"); screenshot in $OUT"
