#!/usr/bin/env bash
# racecheck over a whole program, judged on our kernels only: runs CMD under compute-sanitizer
# racecheck (every kernel instrumented), counts the reported hazards per kernel, prints
# "racecheck: exit RC; hazards: N in KERNEL, ..." and passes when CMD exited 0 and no hazard is
# in a kernel of ours (namespace megatrain).
# Why not --kernel-name: on the first GPU run (2026-11-27, compute-sanitizer of CUDA 13.0)
# `racecheck --kernel-name kns=megatrain` over train_local ended in "Internal Sanitizer Error:
# The Sanitizer failed to handle a hardware exception" at the first cuBLASLt launch, while the
# unfiltered run trained to the end; and the unfiltered run's 12778 hazards were all shown in
# cuDNN's Hopper SDPA kernel (wgmma/TMA/mbarrier code the tool does not model).
# Usage: racecheck_ours.sh SANITIZER CMD...
set -uo pipefail
sanitizer="$1"
shift
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$sanitizer" --tool racecheck --racecheck-report hazard --print-limit 100000 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
counts="$(grep -oE 'Thread \([0-9, ]+\) at [A-Za-z_0-9]+' "$log" | awk '{print $NF}' | sort | uniq -c |
  sort -rn | awk '{printf "%s%s in %s", (NR > 1 ? ", " : ""), $1, $2}')"
ours="$(grep -oE 'Thread \([0-9, ]+\) at [A-Za-z_0-9]+' "$log" | grep -c megatrain)"
echo "racecheck: exit $rc; hazards: ${counts:-none}; in our kernels: $ours"
((rc == 0 && ours == 0))
