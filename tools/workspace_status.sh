#!/usr/bin/env bash
# Bazel workspace status: the source commit megatrain's binaries stamp into the
# build identity of every lineage record ("unknown" outside a git checkout).
commit="$(git -C "$(dirname "$0")/.." rev-parse HEAD 2>/dev/null || true)"
echo "STABLE_MEGATRAIN_COMMIT ${commit:-unknown}"
