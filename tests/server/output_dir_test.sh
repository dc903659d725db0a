#!/usr/bin/env bash
# Issue 16, point 5, against a real megatraind: output_dir aliases ('/x/', '/x/./', '//x', a
# symlink to it) name the same directory after a restart too, a dangling symlink is refused, a
# finished job's directory is reused only with --reuse_output_dir (never a running one's), and
# the reusing job's retention and resume never touch the finished job's checkpoints.
source "$(dirname "$0")/daemon_test_lib.sh"

args="--model_config=$WORK/data/config.json --text=$WORK/data/corpus.txt --batch_size=2 --seq_len=32 --lr=1e-3"
cat > "$WORK/every_step.json" <<'JSON'
{"checkpoints": {"everySteps": "1", "keepLast": 1}}
JSON
checkpoints_of_first() { ls "$WORK/out/x/checkpoints" | grep '^step-' | tr '\n' ' '; }

start_daemon --test_hold_after_step=50
first=$(cli submit $args --steps=3 --output_dir="$WORK/out/x") || fail "submit first"
timeout 300 "$MEGATRAIN" --socket="$SOCKET" watch "$first" > /dev/null || fail "first job failed"
before=$(checkpoints_of_first)
[ -n "$before" ] || fail "the first job left no checkpoint"
stop_daemon
start_daemon --test_hold_after_step=50

# After the restart every alias of the finished job's directory is refused, naming the job.
ln -s "$WORK/out/x" "$WORK/out/link"
for alias in "$WORK/out/x" "$WORK/out/x/" "$WORK/out/x/./" "/$WORK/out/x" "$WORK/out//x" \
  "$WORK/out/link" "$WORK/out/link/"; do
  expect_refused "'$first'" submit $args --steps=2 --output_dir="$alias"
  grep -qF "reuse_output_dir" "$WORK/refused.txt" || fail "refusal for $alias lacks the flag"
done
# A dangling symlink is refused (it would be a second name of a directory made later).
ln -s "$WORK/out/later" "$WORK/out/dangling"
expect_refused "dangling symlink" submit $args --steps=2 --output_dir="$WORK/out/dangling"
expect_refused "dangling symlink" submit $args --steps=2 --output_dir="$WORK/out/dangling/sub"

# Reuse on purpose: the job starts from step 0 (not from the first job's checkpoint), its
# keep_last=1 retention works in its own directory, the first job's checkpoints stay.
second=$(cli submit --spec="$WORK/every_step.json" $args --steps=3 --output_dir="$WORK/out/x/" \
  --reuse_output_dir) || fail "reuse refused"
timeout 300 "$MEGATRAIN" --socket="$SOCKET" watch "$second" > /dev/null || fail "second job failed"
[ "$(jq -r .resumed_from_step "$WORK/out/x/result.json")" = 0 ] ||
  fail "the reusing job resumed from another job's checkpoint: $(cat "$WORK/out/x/result.json")"
[ "$(checkpoints_of_first)" = "$before" ] ||
  fail "the first job's checkpoints changed: '$before' -> '$(checkpoints_of_first)'"
[ "$(ls "$WORK/out/x/checkpoints/$second" | grep -c '^step-')" = 1 ] ||
  fail "the second job's checkpoints: $(ls "$WORK/out/x/checkpoints/$second")"

# Purged jobs (megatrain purge) no longer name the directory, but their checkpoints are still
# there: reusing it still needs the flag.
cli purge --older_than_days=0.0000001 > "$WORK/purged.txt" || fail "purge"
grep -qx "$first" "$WORK/purged.txt" && grep -qx "$second" "$WORK/purged.txt" ||
  fail "purge printed: $(cat "$WORK/purged.txt")"
cli status "$first" > /dev/null 2>&1 && fail "a purged job is still known"
expect_refused "already holds checkpoints" submit $args --steps=2 --output_dir="$WORK/out/x"

# A directory in use by a running job is never reused, with or without the flag.
busy=$(cli submit $args --steps=1000 --output_dir="$WORK/out/busy") || fail "submit busy"
await 120 "the busy job to reach its hold" step_at_least "$busy" 50
expect_refused "already used by job '$busy'" submit $args --steps=2 \
  --output_dir="$WORK/out/busy/." --reuse_output_dir
cli cancel "$busy" > /dev/null || fail "cancel busy"
stop_daemon
echo PASS
