#!/usr/bin/env bash
# ZeRO-1 is exact (docs/scale_out.md): W ranks under mpirun on loopback, each owning whole
# parameter-store entries' optimizer state and running micro-batch slot r, give bitwise the
# losses, gradient norms and final weights of one process with accumulation W — for W = 2 and 3 —
# on every rank.
set -euo pipefail
launch="$1"
worker="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
steps=4
for world in 2 3; do
  prefix="${dir}/w${world}"
  "${worker}" "${prefix}" "${world}" "${steps}" 0
  timeout 300 "${launch}" "${world}" "${worker}" "${prefix}" "${world}" "${steps}" zero1
  [[ "$(wc -l <"${prefix}.accum.losses")" == "${steps}" ]] ||
    { echo "FAIL: ${prefix}.accum.losses has not ${steps} steps"; exit 1; }
  for ((r = 0; r < world; ++r)); do
    for what in losses weights; do
      cmp "${prefix}.accum.${what}" "${prefix}.rank${r}.${what}" || {
        echo "FAIL: ZeRO-1 W=${world}: rank ${r}'s ${what} differ from accumulation ${world}"
        diff "${prefix}.accum.losses" "${prefix}.rank${r}.losses" || true
        exit 1
      }
    done
  done
  echo "ZeRO-1 W=${world}: every rank's losses and weights equal accumulation ${world} bit for bit"
done
# The check is not vacuous: the weights moved from one step to the next, so a rank that missed an
# owner's broadcast would differ (accumulation 1 and 2 differ too).
"${worker}" "${dir}/w1" 1 "${steps}" 0
if cmp -s "${dir}/w1.accum.weights" "${dir}/w2.accum.weights"; then
  echo "FAIL: accumulation 1 and 2 gave the same weights"; exit 1
fi
echo PASS
