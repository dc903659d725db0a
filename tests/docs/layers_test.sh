#!/usr/bin/env bash
# Layers point down (docs/architecture.md): scripts/check-layers over the checkout this test was
# built from (it follows its runfiles symlink there, so BUILD edits are seen without a rebuild).
set -uo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}" || exit 1
exec scripts/check-layers
