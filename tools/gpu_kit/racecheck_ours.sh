#!/usr/bin/env bash
# racecheck over a whole program, judged on our kernels only: runs CMD under compute-sanitizer
# racecheck (every kernel instrumented), counts the reported hazards per kernel, prints
# "racecheck: exit RC; hazards: N in KERNEL, ...; in our kernels: N" and passes when CMD exited 0
# and no hazard is in a kernel of ours (namespace megatrain).
# Why not --kernel-name: on the first GPU run (2026-11-27, compute-sanitizer of CUDA 13.0)
# `racecheck --kernel-name kns=megatrain` over train_local ended in "Internal Sanitizer Error:
# The Sanitizer failed to handle a hardware exception" at the first cuBLASLt launch, while the
# unfiltered run trained to the end; and the unfiltered run's 12778 hazards were all shown in
# cuDNN's Hopper SDPA kernel (wgmma/TMA/mbarrier code the tool does not model).
# A hazard line names the kernel after " at ", up to "+0x<offset>"; a template kernel's name
# starts with its return type ("void megatrain::...::AttentionForwardKernel<64>(...)+0x10").
# Usage: racecheck_ours.sh SANITIZER CMD...
set -uo pipefail
sanitizer="$1"
shift
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$sanitizer" --tool racecheck --racecheck-report hazard --print-limit 100000 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
kernels="$(grep -E 'Thread \([0-9, ]+\) at ' "$log" | sed -E 's/.* at (.*)\+0x[0-9a-fA-F]+.*/\1/' || true)"
counts="$(sort <<<"$kernels" | uniq -c | sort -rn | awk 'NF > 1 {
  n = $1; $1 = ""; printf "%s%d in%s", (shown++ ? ", " : ""), n, $0 }')"
ours="$(grep -c 'megatrain' <<<"$kernels" || true)"
echo "racecheck: exit $rc; hazards: ${counts:-none}; in our kernels: ${ours:-0}"
((rc == 0 && ${ours:-0} == 0))
