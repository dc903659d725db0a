#!/usr/bin/env bash
# Several devices in each of several ranks (docs/scale_out.md "Several devices in each rank"): 2
# ranks under mpirun, each driving 2 CPU devices (--devices=2), accumulation 4. Each rank's devices
# meet in its slabs first, as one device running the rank's 2 micro-batches would leave them, and
# the ranks then reduce those: so the job writes bit for bit the checkpoint of 2 ranks with one
# device each and accumulation 4. Checked with the devices taking turns on the host and with their
# reduce-scatter, for a tied model, under ZeRO-1, and resumed across the two layouts. An
# accumulation a rank cannot spread over its devices is refused, naming the numbers.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
train="$2"
config="$3"
same_optimizer="$4"
tied_config="$5"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
run=(--steps=4 --micro_batch=1 --seq_len=32 --accumulation=4 --eval_every=0 --warmup=1 --threads=1
  --optimizer_threads=1 --arena_mb=64 --checkpoint_every=2 --data_parallel)
common=(--config="${config}" "${run[@]}")

# two_ranks NAME ARGS...: a 2-rank job writing its checkpoints under DIR/NAME, its log in
# DIR/NAME.log (shown on failure).
two_ranks() {
  local name="$1"
  shift
  timeout 300 "${launch}" 2 "${train}" "$@" --checkpoint_dir="${dir}/${name}" \
    2>"${dir}/${name}.log" || { cat "${dir}/${name}.log"; echo "FAIL: ${name}"; exit 1; }
}
# Both devices of a rank ran: its progress lines carry one stall figure per device.
two_devices_ran() {
  grep -Eq "^step 4/4 .* stall [0-9.]+/[0-9.]+ s" "${dir}/$1.log" ||
    { cat "${dir}/$1.log"; echo "FAIL: $1: no per-device stall figures (one device ran?)"; exit 1; }
}

two_ranks one "${common[@]}"
two_ranks turns "${common[@]}" --devices=2 --gradient_reduction=host
two_devices_ran turns
same_state "$(step "${dir}/one" 4)" "$(step "${dir}/turns" 4)" \
  "2 ranks x 2 devices (turns) vs 2 ranks x 1 device"
two_ranks reduced "${common[@]}" --devices=2 --gradient_reduction=devices
two_devices_ran reduced
grep -q "gradient reduction: a reduce-scatter among the 2 devices" "${dir}/reduced.log" ||
  { cat "${dir}/reduced.log"; echo "FAIL: the devices did not reduce-scatter"; exit 1; }
same_state "$(step "${dir}/one" 4)" "$(step "${dir}/reduced" 4)" \
  "2 ranks x 2 devices (reduce-scatter) vs 2 ranks x 1 device"

# A tied model: the rows' gradient apart from the LM head's, on every device of the rank.
tied=(--config="${tied_config}" "${run[@]}")
two_ranks tied_one "${tied[@]}"
two_ranks tied_two "${tied[@]}" --devices=2
two_devices_ran tied_two
same_state "$(step "${dir}/tied_one" 4)" "$(step "${dir}/tied_two" 4)" \
  "tied: 2 ranks x 2 devices vs 2 ranks x 1 device"

# ZeRO-1: the owners reduce the ranks' slabs as they would one device's.
two_ranks zero1_one "${common[@]}" --zero1
two_ranks zero1_two "${common[@]}" --zero1 --devices=2
two_devices_ran zero1_two
same_state "$(step "${dir}/zero1_one" 4)" "$(step "${dir}/zero1_two" 4)" \
  "ZeRO-1: 2 ranks x 2 devices vs 2 ranks x 1 device" "${same_optimizer}"

# Resumed from the one-device job's step 2 on 2 devices per rank: the same bits at step 4.
mkdir -p "${dir}/resumed"
cp -r "$(step "${dir}/one" 2)" "${dir}/resumed/"
two_ranks resumed "${common[@]}" --devices=2 --resume
expect_resumed "${dir}/resumed.log" "2 ranks x 2 devices from a 2 x 1 checkpoint"
same_state "$(step "${dir}/one" 4)" "$(step "${dir}/resumed" 4)" \
  "2 ranks x 2 devices resumed from 2 ranks x 1 device at step 2"

# Accumulation 2 over 2 ranks leaves each rank one micro-batch for two devices.
expect_refused "accumulation 2 over 2 ranks x 2 devices" "${dir}/odd.log" \
  "grad_accumulation=2 over 2 ranks gives each rank 1 micro-batches, not a multiple of devices=2" \
  timeout 300 "${launch}" 2 "${train}" "${common[@]}" --accumulation=2 --devices=2
echo PASS
