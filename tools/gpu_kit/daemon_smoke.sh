#!/usr/bin/env bash
# The kit's daemon stage: starts megatraind on DEVICE in a scratch folder, submits a 3-step job on
# the tiny model through the megatrain CLI, watches it to the end, and stops the daemon.
# Usage: daemon_smoke.sh KIT DEVICE   (DEVICE: cpu or cuda)
# MEGATRAIND_LAUNCHER (words, optional) runs megatraind under it (syscall_filter.sh: seccomp_exec).
set -euo pipefail
kit="$1"
device="$2"
read -ra launcher <<<"${MEGATRAIND_LAUNCHER:-}"
work="$(mktemp -d /tmp/mtkit.XXXXXX)"  # short: a Unix socket path holds at most 107 bytes
mkdir -p "$work/out"
"${launcher[@]}" "$kit/bin/megatraind" --state_dir="$work/state" --socket_path="$work/d.sock" \
  --data_roots="$kit/share" --output_roots="$work/out" --metrics_address=127.0.0.1:0 \
  --device="$device" --device_arena_bytes=$((1 << 30)) --pinned_budget_bytes=$((2 << 30)) \
  2>"$work/megatraind.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  echo "--- megatraind log (last 40 lines)"
  tail -n 40 "$work/megatraind.log"
  grep 'seccomp_report:' "$work/megatraind.log" || true  # under syscall_filter.sh --report
  rm -rf "$work"
}
trap cleanup EXIT
cli() { "$kit/bin/megatrain" --socket="$work/d.sock" "$@"; }
cli --wait_seconds=30 daemon-status
id=$(cli submit --name=kit-smoke --model_config="$kit/share/tiny.json" --text="$kit/share/text" \
  --steps=3 --batch_size=2 --seq_len=64 --lr=1e-3 --warmup_steps=1 --eval_every=0 \
  --output_dir="$work/out/smoke")
echo "submitted $id"
cli watch "$id"
cli status "$id"
