#!/usr/bin/env bash
# Data parallelism is exact (docs/scale_out.md): W ranks under mpirun on loopback, each running
# micro-batch slot r, give bitwise the losses, gradient norms and final weights of one process
# with accumulation W — for W = 2 and 3, untied and tied embeddings — on every rank.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
worker="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
steps=4
ranks_equal_accumulation "${launch}" "${worker}" "${dir}" "${steps}" 0 ""
# A tied embedding gets two contributions per micro-batch (the LM head's gradient, then the rows'
# scatter), which accumulation adds to the slab one at a time: each rank keeps the rows' scatter
# apart and the reduction adds h_0, E_0, h_1, E_1, ... in that order (docs/scale_out.md), so a
# tied model is exact too.
ranks_equal_accumulation "${launch}" "${worker}" "${dir}" "${steps}" 1 "tied " tied
# The check is not vacuous: a different accumulation gives different bits.
accumulation_changes_weights "${worker}" "${dir}" "${steps}"
echo PASS
