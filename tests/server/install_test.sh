#!/usr/bin/env bash
# scripts/install into a temporary root: files land where the unit expects them, the unit passes
# `systemd-analyze verify`, the daemon's signing key is created once (0600), the installed
# example config starts the installed daemon, which finds megatrain_tokenize beside itself and
# runs a job whose text uses a SentencePiece model.
source "$(dirname "$0")/daemon_test_lib.sh"
# The runfiles link back into the source tree, where scripts/install lives.
repo="$(cd "$(dirname "$(readlink -f "$RUNFILES/deploy/megatraind.service")")/.." && pwd)"
[ -x "$repo/scripts/install" ] || fail "scripts/install not found from $repo"
mkdir -p "$WORK/bin"
cp "$MEGATRAIND" "$MEGATRAIN" "$RUNFILES/engine/data/megatrain_tokenize" "$WORK/bin/"
R="$WORK/root"
"$repo/scripts/install" --prefix="$R/usr" --sysconfdir="$R/etc" --statedir="$R/var/lib" \
  --bin-dir="$WORK/bin" --no-user > "$WORK/install.log" || fail "install: $(cat "$WORK/install.log")"
unit="$R/usr/lib/systemd/system/megatraind.service"
for f in "$R/usr/bin/megatraind" "$R/usr/bin/megatrain" "$R/usr/bin/megatrain_tokenize" "$unit" \
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
sp=$(cli submit --spec="$WORK/sp_job.json") || fail "submit sentencepiece job"
timeout 120 "$MEGATRAIN" --socket="$SOCKET" watch "$sp" > "$WORK/sp_watch.txt" ||
  fail "sentencepiece job: $(cli status "$sp")"
ls "$WORK"/out/sp/tokens/*.u16 > /dev/null || fail "no token file in $WORK/out/sp/tokens"
stop_daemon
# Installing again keeps an edited config and drops the example beside it.
echo "# edited" >> "$R/etc/megatrain/megatraind.textproto"
"$repo/scripts/install" --prefix="$R/usr" --sysconfdir="$R/etc" --statedir="$R/var/lib" \
  --bin-dir="$WORK/bin" --no-user > /dev/null
grep -q "# edited" "$R/etc/megatrain/megatraind.textproto" || fail "config overwritten"
[ "$(tr -d '[:space:]' < "$R/var/lib/megatrain/signing_key.pub")" = "$installed_key" ] ||
  fail "installing again replaced the signing key"
[ -f "$R/etc/megatrain/megatraind.textproto.example" ] || fail "no .example"
echo PASS
