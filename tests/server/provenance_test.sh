#!/usr/bin/env bash
# Provenance through a real megatraind: the daemon's signing key (0600, public key printed by
# daemon-status), a job's final checkpoint verified against it, the data check on resume (one
# changed byte refused with the file and both hashes named; --allow-data-change resumes, the
# audit log shows the allowance and the next checkpoint's lineage the DataChange), and the audit
# log's hash chain catching an altered and a deleted row (offline with --db, and online).
source "$(dirname "$0")/daemon_test_lib.sh"

state() { cli status "$1" --json | jq -r .state; }
step() { cli status "$1" --json | jq -r '.progress.step // 0'; }

# spec <name> <steps> <every_steps> <data file>
spec() {
  cat > "$WORK/$1.json" <<JSON
{"name": "$1", "model": {"config_json_path": "$WORK/data/config.json"},
 "data": {"text_files": ["$4"]},
 "hyper": {"steps": $2, "batch_size": 4, "seq_len": 64, "lr": {"peak_lr": 0.001}},
 "checkpoints": {"every_steps": $3},
 "output_dir": "$WORK/out/$1", "seed": 5}
JSON
  echo "$WORK/$1.json"
}

# The hold (test hook) keeps the job paused below at a step < its last, however fast the machine.
start_daemon --test_hold_after_step=10
key="$WORK/state/signing_key"
pub="$WORK/state/signing_key.pub"
[ "$(stat -c %a "$key")" = 600 ] || fail "signing_key mode $(stat -c %a "$key"), not 600"
[ -f "$pub" ] || fail "no signing_key.pub"
pubhex=$(tr -d '[:space:]' < "$pub")
[ "${#pubhex}" = 64 ] || fail "signing_key.pub holds '$pubhex'"
[ "$(cli daemon-status --json | jq -r .public_key)" = "$pubhex" ] || fail "daemon-status --json key"
cli daemon-status | grep -q "signing key: $pubhex" || fail "daemon-status text lacks the key"

# A short job: its final checkpoint verifies against the daemon's key, chained to random init.
short=$(cli submit --spec="$(spec short 6 3 "$WORK/data/corpus.txt")") || fail "submit short"
timeout 300 "$MEGATRAIN" --socket="$SOCKET" watch "$short" > /dev/null || fail "short job"
final=$(ls -d "$WORK/out/short/checkpoints"/step-* | tail -n 1)
"$MEGATRAIN" verify "$final" --pubkey "$pub" > "$WORK/verify.log" 2>&1 ||
  fail "verify --pubkey of $final: $(cat "$WORK/verify.log")"
jq -e '.lineage.device_kind == "cpu" and (.lineage.inputs | map(.role) | index("data")) != null' \
  "$final/provenance.json" > /dev/null || fail "lineage of $final: $(jq -c .lineage "$final/provenance.json")"
[ "$(jq -r '.lineage.inputs[0].sha256' "$final/provenance.json")" = \
  "$(sha256sum "$WORK/data/corpus.txt" | cut -d' ' -f1)" ] || fail "data hash in the lineage"

# Pause a running job, change one byte of its data file, resume.
data="$WORK/data/changing.txt"
cp "$WORK/data/corpus.txt" "$data"
old_sha=$(sha256sum "$data" | cut -d' ' -f1)
id=$(cli submit --spec="$(spec change 300 100 "$data")") || fail "submit"
await 120 "job $id to reach the hold at step 10" step_at_least "$id" 10
cli pause "$id" > /dev/null || fail "pause"
await 120 "job $id to pause" state_is "$id" PAUSED
paused_step=$(step "$id")
printf 'X' | dd of="$data" bs=1 seek=100 conv=notrunc status=none
new_sha=$(sha256sum "$data" | cut -d' ' -f1)
[ "$old_sha" != "$new_sha" ] || fail "the byte did not change the file"
set +e
cli resume "$id" > /dev/null 2> "$WORK/resume.err"
rc=$?
set -e
[ "$rc" = 4 ] || fail "resume with changed data: exit $rc, expected 4 ($(cat "$WORK/resume.err"))"
for needle in "$data" "$old_sha" "$new_sha" "--allow-data-change"; do
  grep -qF -- "$needle" "$WORK/resume.err" || fail "refusal lacks '$needle': $(cat "$WORK/resume.err")"
done
[ "$(state "$id")" = PAUSED ] || fail "refused job is $(state "$id"), not PAUSED"
cli audit "$id" | grep -q "data_change_refused" || fail "audit lacks the refusal"

cli resume "$id" --allow-data-change > /dev/null || fail "resume --allow-data-change"
timeout 600 "$MEGATRAIN" --socket="$SOCKET" watch "$id" > /dev/null || fail "job after the allowance"
cli audit "$id" > "$WORK/audit.txt" || fail "audit of $id: $(cat "$WORK/audit.txt")"
grep "data_change_allowed" "$WORK/audit.txt" | grep -qF "$new_sha" || fail "audit lacks the allowance"
for kind in submit start lineage_recorded checkpoint pause resume resumed_from_checkpoint completion; do
  grep -q " $kind " "$WORK/audit.txt" || fail "audit lacks '$kind': $(cat "$WORK/audit.txt")"
done
grep -q "audit chain OK" "$WORK/audit.txt" || fail "audit chain not OK"
# Checkpoints after the resume carry the DataChange; those before it do not.
next=$(ls -d "$WORK/out/change/checkpoints"/step-* | tail -n 1)
jq -e --arg p "$data" --arg o "$old_sha" --arg n "$new_sha" \
  '.lineage.data_changes | length == 1 and .[0].path == $p and .[0].old_sha256 == $o and
   .[0].new_sha256 == $n' "$next/provenance.json" > /dev/null ||
  fail "lineage of $next: $(jq -c .lineage.data_changes "$next/provenance.json")"
before="$WORK/out/change/checkpoints/$(printf 'step-%012d' "$paused_step")"
[ -f "$before/provenance.json" ] || fail "no pause checkpoint $before"
jq -e '.lineage.data_changes | length == 0' "$before/provenance.json" > /dev/null ||
  fail "the pause checkpoint already has a data change"
"$MEGATRAIN" verify "$next" --pubkey "$pub" > "$WORK/verify2.log" 2>&1 ||
  fail "verify after the allowance: $(cat "$WORK/verify2.log")"
stop_daemon

# Tamper with the audit table (the triggers refuse plain writes, so an attacker drops them).
db="$WORK/state/megatrain.db"
"$MEGATRAIN" audit "$short" --db="$db" > /dev/null || fail "offline audit of an intact log"
set +e
sqlite3 "$db" "UPDATE audit SET message = 'x' WHERE job_id = '$short';" 2> /dev/null
rc=$?
set -e
[ "$rc" != 0 ] || fail "the audit table accepted an UPDATE"
altered_row=$(sqlite3 "$db" "SELECT row FROM audit WHERE job_id = '$id' AND seq = 3;")
sqlite3 "$db" "DROP TRIGGER audit_no_update;
  UPDATE audit SET message = 'forged' WHERE row = $altered_row;"
set +e
"$MEGATRAIN" audit "$id" --db="$db" > "$WORK/altered.out" 2> "$WORK/altered.err"
rc=$?
set -e
[ "$rc" = 1 ] || fail "offline audit of an altered row: exit $rc"
grep -q "chain broken at row $altered_row:.*seq 3.*altered" "$WORK/altered.err" ||
  fail "altered row not named: $(cat "$WORK/altered.err")"
grep -q "^BAD row $altered_row " "$WORK/altered.out" || fail "altered row not marked"

next_row=$(sqlite3 "$db" "SELECT row FROM audit WHERE job_id = '$short' AND seq = 3;")
sqlite3 "$db" "DROP TRIGGER audit_no_delete; DELETE FROM audit WHERE job_id = '$short' AND seq = 2;"
set +e
"$MEGATRAIN" audit "$short" --db="$db" > /dev/null 2> "$WORK/deleted.err"
rc=$?
set -e
[ "$rc" = 1 ] || fail "offline audit of a deleted row: exit $rc"
grep -q "chain broken at row $next_row:.*seq 2 expected.*deleted" "$WORK/deleted.err" ||
  fail "deleted row not named: $(cat "$WORK/deleted.err")"

# The daemon's own check (online) sees the same.
start_daemon
set +e
cli audit "$short" --json > "$WORK/online.json"
rc=$?
set -e
[ "$rc" = 1 ] || fail "online audit of a deleted row: exit $rc"
jq -e --argjson r "$next_row" '.chain_ok == false and (.first_bad_row | tonumber) == $r' \
  "$WORK/online.json" > /dev/null || fail "online audit JSON: $(cat "$WORK/online.json")"
stop_daemon
echo PASS
