#!/usr/bin/env bash
# Data parallelism is exact (docs/scale_out.md): W ranks under mpirun on loopback, each running
# micro-batch slot r, give bitwise the losses, gradient norms and final weights of one process
# with accumulation W — for W = 2 and 3 — on every rank.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
worker="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
steps=4
ranks_equal_accumulation "${launch}" "${worker}" "${dir}" "${steps}" 0 ""
# A tied embedding gets two contributions per micro-batch (LM head, then the rows' scatter), which
# accumulation adds to the slab one at a time and the reduction as one per rank: the ranks agree
# bit for bit, but differ from accumulation by that rounding (docs/scale_out.md).
prefix="${dir}/tied"
timeout 300 "${launch}" 3 "${worker}" "${prefix}" 3 "${steps}" 1
for r in 1 2; do
  same_run "${prefix}.rank0" "${prefix}.rank${r}" "tied W=3: ranks 0 and ${r}"
done
echo "tied W=3: every rank's losses and weights equal"
# The check is not vacuous: a different accumulation gives different bits.
accumulation_changes_weights "${worker}" "${dir}" "${steps}"
echo PASS
