#!/usr/bin/env bash
# train_local --zero1 as a data-parallel job (docs/scale_out.md, ZeRO-1): W = 2 and 3 ranks under
# mpirun with accumulation W write sharded checkpoints (one optimizer shard per rank, one
# manifest) holding bit for bit the model, optimizer state and trainer state of one process with
# accumulation W (W = 2 for a tied model too). The sharded checkpoints resume on any world size: on
# 2 ZeRO-1 ranks, in one process, and (accumulation 6) on 3 ranks; a one-process checkpoint
# resumes on 2 ZeRO-1 ranks. A ZeRO-1 job whose rank 1 is killed with kill -9 after its first
# checkpoint ends non-zero, and relaunched with --resume ends at the uninterrupted run's bits.
# With the optimizer state on NVMe each rank's state file holds its shard only, at the same bits,
# and with the gradients on NVMe too (each chunk reduced to its owner) the bits are the same.
# --zero1 alone is refused.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
train="$2"
config="$3"
same_optimizer="$4"
tied_config="$5"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
run=(--micro_batch=1 --seq_len=32 --eval_every=0 --warmup=1 --threads=1 --optimizer_threads=1
  --arena_mb=64 --collective_timeout_s=120)
common=(--config="${config}" "${run[@]}")
# Shards are compared tensor by tensor with an unsharded optimizer file (same_optimizer_state.py).
same_sharded_state() { same_state "$1" "$2" "$3" "${same_optimizer}"; }

for world in 2 3; do
  job=("${common[@]}" --steps=4 --accumulation="${world}" --checkpoint_every=2)
  "${train}" "${job[@]}" --checkpoint_dir="${dir}/alone${world}" 2>"${dir}/alone${world}.log"
  timeout 300 "${launch}" "${world}" "${train}" "${job[@]}" --data_parallel --zero1 \
    --checkpoint_dir="${dir}/zero1_${world}" 2>"${dir}/zero1_${world}.log"
  cat "${dir}/zero1_${world}.log"
  [[ "$(grep -c "^step 4/4 .*(checkpoint written)" "${dir}/zero1_${world}.log")" == 1 ]] ||
    { echo "FAIL: W=${world}: not exactly one progress line (rank 0's) for step 4"; exit 1; }
  for s in 2 4; do
    for ((r = 0; r < world; ++r)); do
      shard="$(printf 'optimizer-rank-%05d-of-%05d.safetensors' "${r}" "${world}")"
      [[ -f "$(step "${dir}/zero1_${world}" "${s}")/${shard}" ]] ||
        { echo "FAIL: W=${world} step ${s} has no ${shard}"; exit 1; }
    done
    [[ ! -e "$(step "${dir}/zero1_${world}" "${s}")/optimizer.safetensors" ]] ||
      { echo "FAIL: W=${world}: a ZeRO-1 checkpoint has an unsharded optimizer file"; exit 1; }
    same_sharded_state "$(step "${dir}/alone${world}" "${s}")" \
      "$(step "${dir}/zero1_${world}" "${s}")" \
      "${world} ZeRO-1 ranks vs accumulation ${world}, step ${s}"
  done
done

# A tied model: each owner adds every rank's LM-head gradient and rows' gradient (kept apart) in one
# process's order, so 2 ZeRO-1 ranks write accumulation 2's checkpoint bit for bit.
tied=(--config="${tied_config}" "${run[@]}" --steps=4 --accumulation=2 --checkpoint_every=4)
"${train}" "${tied[@]}" --checkpoint_dir="${dir}/tied_alone" 2>"${dir}/tied_alone.log"
timeout 300 "${launch}" 2 "${train}" "${tied[@]}" --data_parallel --zero1 \
  --checkpoint_dir="${dir}/tied_zero1" 2>"${dir}/tied_zero1.log" ||
  { cat "${dir}/tied_zero1.log"; echo "FAIL: 2 ZeRO-1 ranks of a tied model"; exit 1; }
same_sharded_state "$(step "${dir}/tied_alone" 4)" "$(step "${dir}/tied_zero1" 4)" \
  "tied: 2 ZeRO-1 ranks vs accumulation 2"

# Resume at another world size, from step 2 to step 4, each against the uninterrupted run.
resume() {  # resume NAME FROM_CHECKPOINT RANKS [FLAGS...]: RANKS 1 = one process
  local name="$1" from="$2" ranks="$3"
  shift 3
  mkdir -p "${dir}/${name}"
  cp -r "${from}" "${dir}/${name}/"
  if [[ "${ranks}" == 1 ]]; then
    "${train}" "${common[@]}" --resume --checkpoint_dir="${dir}/${name}" "$@" 2>"${dir}/${name}.log"
  else
    timeout 300 "${launch}" "${ranks}" "${train}" "${common[@]}" --data_parallel --resume \
      --checkpoint_dir="${dir}/${name}" "$@" 2>"${dir}/${name}.log"
  fi
  grep -q "resumed from .*step-000000000002 at step 2" "${dir}/${name}.log" ||
    { cat "${dir}/${name}.log"; echo "FAIL: ${name} did not resume"; exit 1; }
}
resume zero1_to_zero1 "$(step "${dir}/zero1_2" 2)" 2 --steps=4 --accumulation=2 --zero1
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_to_zero1" 4)" \
  "2 ZeRO-1 ranks resumed from 2 shards"
resume zero1_to_alone "$(step "${dir}/zero1_2" 2)" 1 --steps=4 --accumulation=2
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_to_alone" 4)" \
  "one process resumed from 2 shards"
resume alone_to_zero1 "$(step "${dir}/alone2" 2)" 2 --steps=4 --accumulation=2 --zero1
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/alone_to_zero1" 4)" \
  "2 ZeRO-1 ranks resumed from a one-process checkpoint"
# 2 -> 3 ranks needs an accumulation both divide (6): with several micro-batches per rank the sum
# order is not one process's, so 3 ZeRO-1 ranks are compared with 3 replicated ranks resuming the
# same 2-shard checkpoint (ZeRO-1 reduces in the same rank order).
six=("${common[@]}" --steps=4 --accumulation=6)
timeout 300 "${launch}" 2 "${train}" "${six[@]}" --data_parallel --zero1 --checkpoint_every=2 \
  --checkpoint_dir="${dir}/six" 2>"${dir}/six.log"
resume six_to_zero1_3 "$(step "${dir}/six" 2)" 3 --steps=4 --accumulation=6 --zero1
resume six_to_replicated_3 "$(step "${dir}/six" 2)" 3 --steps=4 --accumulation=6
same_sharded_state "$(step "${dir}/six_to_replicated_3" 4)" \
  "$(step "${dir}/six_to_zero1_3" 4)" \
  "2 shards resumed on 3 ZeRO-1 ranks vs on 3 replicated ranks"

# kill -9 of rank 1 after the first checkpoint. Every step is slowed to about a second (an
# emulated link latency, which changes no result), so the job cannot have finished before the kill
# lands, however fast the machine.
write_pid_rank_script "${dir}/rank.sh" "${train}"
eight=("${common[@]}" --steps=8 --accumulation=2 --checkpoint_every=2)
"${train}" "${eight[@]}" --checkpoint_dir="${dir}/alone8" 2>"${dir}/alone8.log"
RANK_PID_PREFIX="${dir}/killed.rank" timeout 300 "${launch}" 2 "${dir}/rank.sh" "${eight[@]}" \
  --zero1 --checkpoint_dir="${dir}/killed" \
  --link_latency_us=50000 >"${dir}/killed.log" 2>&1 &
mpirun_pid=$!
wait_for_checkpoint "${dir}/killed" 2 "${dir}/killed.log" "the ZeRO-1 job to kill"
kill -9 "$(cat "${dir}/killed.rank1.pid")"
rc=0
wait "${mpirun_pid}" || rc=$?
expect_aborted "ZeRO-1 job with rank 1 killed" "${rc}" "${dir}/killed.log"
[[ ! -e "$(step "${dir}/killed" 8)" ]] || { echo "FAIL: the killed job finished"; exit 1; }
timeout 300 "${launch}" 2 "${train}" "${eight[@]}" --zero1 --resume \
  --checkpoint_dir="${dir}/killed" 2>"${dir}/relaunched.log"
expect_resumed "${dir}/relaunched.log" "ZeRO-1 job killed (kill -9 rank 1)"
same_sharded_state "$(step "${dir}/alone8" 8)" "$(step "${dir}/killed" 8)" \
  "ZeRO-1 job killed (kill -9 rank 1) and relaunched"

# The optimizer state on NVMe: each rank's state file holds its own entries' m and v only (well
# under one process's whole file), and the job ends at the bits of one process with everything in
# RAM; resumed from its step-2 checkpoint (each rank's m and v read back into its file) it ends
# there again.
nvme=(--nvme_mb=1000 --pinned_ram_mb=1000 --ram_mb=1000 --states_on_nvme --nvme_chunk_mb=1)
two=("${common[@]}" --steps=4 --accumulation=2 --checkpoint_every=2)
mkdir -p "${dir}/nvme_whole" "${dir}/nvme_zero1" "${dir}/nvme_resumed" "${dir}/zero1_nvme_resumed"
"${train}" "${two[@]}" "${nvme[@]}" --nvme_dir="${dir}/nvme_whole" \
  --checkpoint_dir="${dir}/whole_nvme" 2>"${dir}/whole_nvme.log"
timeout 300 "${launch}" 2 "${train}" "${two[@]}" "${nvme[@]}" --nvme_dir="${dir}/nvme_zero1" \
  --zero1 --checkpoint_dir="${dir}/zero1_nvme" 2>"${dir}/zero1_nvme.log" ||
  { cat "${dir}/zero1_nvme.log"; echo "FAIL: ZeRO-1 with the optimizer state on NVMe"; exit 1; }
whole="$(stat -c %s "${dir}/nvme_whole/optimizer_state.bin")"
for r in 0 1; do
  mine="$(stat -c %s "${dir}/nvme_zero1/rank-${r}/optimizer_state.bin")"
  ((mine * 4 < whole * 3)) ||
    { echo "FAIL: rank ${r}'s state file is ${mine} B, one process's ${whole} B"; exit 1; }
  echo "rank ${r}'s NVMe state file: ${mine} of one process's ${whole} bytes"
done
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_nvme" 4)" \
  "2 ZeRO-1 ranks, optimizer state on NVMe, vs accumulation 2 in RAM"
cp -r "$(step "${dir}/zero1_nvme" 2)" "${dir}/zero1_nvme_resumed/"
timeout 300 "${launch}" 2 "${train}" "${two[@]}" "${nvme[@]}" --nvme_dir="${dir}/nvme_resumed" \
  --zero1 --resume --checkpoint_dir="${dir}/zero1_nvme_resumed" 2>"${dir}/zero1_nvme_resumed.log"
expect_resumed "${dir}/zero1_nvme_resumed.log" "ZeRO-1 with the optimizer state on NVMe"
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_nvme_resumed" 4)" \
  "2 ZeRO-1 ranks, optimizer state on NVMe, resumed at step 2"
# The gradients on NVMe too: each chunk is reduced to its owner, which writes it back with its
# norm partials (the other rank drops its copy unwritten), and the owners update from their files.
mkdir -p "${dir}/nvme_grad"
timeout 300 "${launch}" 2 "${train}" "${two[@]}" "${nvme[@]}" --grad_on_nvme \
  --nvme_dir="${dir}/nvme_grad" --zero1 --checkpoint_dir="${dir}/zero1_grad_nvme" \
  2>"${dir}/zero1_grad_nvme.log" ||
  { cat "${dir}/zero1_grad_nvme.log"; echo "FAIL: ZeRO-1 with the gradients on NVMe"; exit 1; }
for r in 0 1; do
  [[ -s "${dir}/nvme_grad/rank-${r}/gradients.bin" ]] ||
    { echo "FAIL: rank ${r} kept no gradients on NVMe"; ls -lR "${dir}/nvme_grad"; exit 1; }
  echo "rank ${r}'s NVMe gradient file: $(stat -c %s "${dir}/nvme_grad/rank-${r}/gradients.bin") bytes"
done
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_grad_nvme" 4)" \
  "2 ZeRO-1 ranks, optimizer state and gradients on NVMe, vs accumulation 2 in RAM"
# The masters on NVMe too: each rank's state file holds master, m and v of its ranges only, the
# fp32 compute copy in RAM every weight (the owners broadcast theirs); resumed from its step-2
# checkpoint (each rank writes its ranges of the masters back into its file) it ends there again.
mkdir -p "${dir}/nvme_master" "${dir}/nvme_master_resumed" "${dir}/zero1_master_resumed"
master=("${two[@]}" "${nvme[@]}" --grad_on_nvme --master_on_nvme --zero1)
timeout 300 "${launch}" 2 "${train}" "${master[@]}" --nvme_dir="${dir}/nvme_master" \
  --checkpoint_dir="${dir}/zero1_master" 2>"${dir}/zero1_master.log" ||
  { cat "${dir}/zero1_master.log"; echo "FAIL: ZeRO-1 with the masters on NVMe"; exit 1; }
for r in 0 1; do
  mine="$(stat -c %s "${dir}/nvme_master/rank-${r}/optimizer_state.bin")"
  ((mine * 4 < whole * 3 * 3 / 2)) ||
    { echo "FAIL: rank ${r}'s state file with masters is ${mine} B (m + v alone: ${whole} B)"; exit 1; }
  echo "rank ${r}'s NVMe state file with its masters: ${mine} bytes"
done
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_master" 4)" \
  "2 ZeRO-1 ranks, masters, optimizer state and gradients on NVMe, vs accumulation 2 in RAM"
cp -r "$(step "${dir}/zero1_master" 2)" "${dir}/zero1_master_resumed/"
timeout 300 "${launch}" 2 "${train}" "${master[@]}" --nvme_dir="${dir}/nvme_master_resumed" \
  --resume --checkpoint_dir="${dir}/zero1_master_resumed" 2>"${dir}/zero1_master_resumed.log"
expect_resumed "${dir}/zero1_master_resumed.log" "ZeRO-1 with the masters on NVMe"
same_sharded_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_master_resumed" 4)" \
  "2 ZeRO-1 ranks, masters on NVMe, resumed at step 2"

# ZeRO-1's shards are the store's chunks: ranks started with different chunk sizes (mpirun's
# MPMD form, one rank each) are refused together before any shard collective.
mkdir -p "${dir}/nvme_chunks"
chunks=("${two[@]}" "${nvme[@]}" --nvme_dir="${dir}/nvme_chunks" --data_parallel --zero1
  --checkpoint_dir="${dir}/zero1_chunks")
expect_refused "ZeRO-1 ranks with different chunks" "${dir}/zero1_chunks.log" \
  "rank 1 runs a different job from rank 0" \
  timeout 300 "${launch}" 1 "${train}" "${chunks[@]}" --nvme_chunk_mb=1 \
  : -np 1 "${train}" "${chunks[@]}" --nvme_chunk_mb=2
echo "ZeRO-1 ranks with different chunks are refused: $(grep -m1 "different job" "${dir}/zero1_chunks.log")"

# --zero1 outside a data-parallel job is refused, naming what it needs.
expect_refused "--zero1 without --data_parallel" "${dir}/alone_zero1.log" \
  "error: --zero1 needs --data_parallel" "${train}" "${common[@]}" --steps=4 --zero1
echo PASS
