#!/usr/bin/env bash
# Every command the docs name exists and answers --help: each scripts/NAME in docs/*.md (run
# with --help, except scripts/bazel, which hands its arguments to Bazel), the binaries
# (megatraind, megatrain, train_local, plan, sample, megatrain_tokenize) and every
# `megatrain SUBCOMMAND` written in backquotes (it must be in `megatrain --help`).
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}" || exit 1
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# 1. Scripts.
for name in $(grep -hoE 'scripts/[A-Za-z0-9_-]+' docs/*.md | sort -u); do
  script="$name"
  if [[ ! -x "$script" ]]; then
    fail "docs name $name, which does not exist (or is not executable): $(grep -l "$name" docs/*.md | tr '\n' ' ')"
    continue
  fi
  [[ "$name" == scripts/bazel ]] && continue
  out="$("$script" --help 2>&1)"
  rc=$?
  [[ $rc -eq 0 && -n "$out" ]] || fail "$name --help exited $rc with: ${out:0:200}"
done

# 2. Binaries: absl prints the usage for --help and exits 0 or 1.
for binary in server/megatraind client/megatrain engine/train/train_local engine/planner/plan \
              engine/train/sample engine/data/megatrain_tokenize; do
  out="$("$binary" --help 2>&1)"
  rc=$?
  name="$(basename "$binary")"
  [[ ( $rc -eq 0 || $rc -eq 1 ) && "$out" == *"$name"* ]] ||
    fail "$binary --help exited $rc without naming itself: ${out:0:200}"
done

# 3. megatrain subcommands named in backquotes.
usage="$(client/megatrain --help 2>&1)"
for sub in $(grep -hoE '`megatrain [a-z][a-z-]*' docs/*.md | awk '{print $2}' | sort -u); do
  grep -qE "^  ${sub}( |$)" <<< "$usage" || fail "docs name \`megatrain $sub\`, not a megatrain command"
done
out="$(client/megatrain verify --help 2>&1)" || fail "megatrain verify --help exited $?"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "every named command answers --help"
