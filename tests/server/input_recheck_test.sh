#!/usr/bin/env bash
# Issue 16, point 2, against a real megatraind: a queued job's input is checked again when the
# job runs. A text file replaced by a symlink to a file outside the data roots, and a directory
# on an input's path replaced by a symlink to a directory outside, fail the job naming the field
# before anything reads them; the outside files are never trained on. Waits are on states.
source "$(dirname "$0")/daemon_test_lib.sh"

reason() { cli status "$1" --json | jq -r .failure_reason; }
small="--model_config=$WORK/data/config.json --batch_size=2 --seq_len=32 --lr=1e-3 --steps=2"

mkdir -p "$WORK/outside"
cp "$WORK/data/corpus.txt" "$WORK/outside/secret.txt"
cp "$WORK/data/corpus.txt" "$WORK/data/swap.txt"
mkdir -p "$WORK/data/sub"
cp "$WORK/data/corpus.txt" "$WORK/data/sub/c.txt"
cp "$WORK/data/corpus.txt" "$WORK/outside/c.txt"

start_daemon --test_hold_after_step=3
blocker=$(cli submit $small --text="$WORK/data/corpus.txt" --steps=1000 \
  --output_dir="$WORK/out/blocker") || fail "submit blocker"
await 120 "the blocker to reach its hold" step_at_least "$blocker" 3
swapped=$(cli submit $small --text="$WORK/data/swap.txt" --output_dir="$WORK/out/swap") ||
  fail "submit swapped"
subdir=$(cli submit $small --text="$WORK/data/sub/c.txt" --output_dir="$WORK/out/sub") ||
  fail "submit subdir"
# While they wait in the queue, a group member swaps the files for ways out of the roots.
rm "$WORK/data/swap.txt"
ln -s "$WORK/outside/secret.txt" "$WORK/data/swap.txt"
mv "$WORK/data/sub" "$WORK/data/sub.orig"
ln -s "$WORK/outside" "$WORK/data/sub"
cli cancel "$blocker" > /dev/null || fail "cancel blocker"

await 120 "the swapped job to end" state_is "$swapped" FAILED
reason "$swapped" | grep -q "data.text_files\[0\]: '$WORK/data/swap.txt' now has a symlink" ||
  fail "swapped: $(reason "$swapped")"
await 120 "the subdirectory job to end" state_is "$subdir" FAILED
reason "$subdir" | grep -q "data.text_files\[0\].*now has a symlink on its way" ||
  fail "subdir: $(reason "$subdir")"
stop_daemon
echo PASS
