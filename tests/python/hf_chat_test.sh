#!/usr/bin/env bash
# tools/hf_chat against transformers: pytest (hf_chat_test.py) in scripts/setup's venv, whose
# Python @hf_venv//:python_path names, writing its JUnit XML to $XML_OUTPUT_FILE so that
# scripts/test counts its cases. A missing venv fails the test naming scripts/setup.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$PWD/..}/megatrain"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/hf_chat.XXXXXX")"
fail() { echo "FAIL: $*" >&2; [ -n "${XML_OUTPUT_FILE:-}" ] && rm -f "$XML_OUTPUT_FILE"; exit 1; }

PY="$(cat "${TEST_SRCDIR:-$PWD/..}/hf_venv/python_path")"
[ -x "$PY" ] || fail "$PY not found: run scripts/setup (it creates the HF chat venv)"
"$PY" -c 'import tokenizers, jinja2, transformers, pytest' ||
  fail "$PY lacks tokenizers, jinja2, transformers or pytest: run scripts/setup"

xml=()
[ -n "${XML_OUTPUT_FILE:-}" ] && xml=(--junitxml="$XML_OUTPUT_FILE")
set +e
(cd "$RUNFILES" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$WORK/hf" \
  PYTHONDONTWRITEBYTECODE=1 timeout 600 "$PY" -m pytest -p no:cacheprovider -v \
  --basetemp="$WORK/pytest" "${xml[@]}" tests/python/hf_chat_test.py)
rc=$?
set -e
# As in client_test.sh: pytest's XML counts the cases when they ran (exit 0 or 1); any other
# exit (interrupted, internal error, no tests, a timeout) removes it, so that Bazel writes its
# own, which counts this target as failed.
[ "$rc" = 1 ] && { echo "FAIL: pytest: some cases failed (see above)" >&2; exit 1; }
[ "$rc" = 0 ] || fail "pytest exited $rc"
echo PASS
