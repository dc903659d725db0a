#!/usr/bin/env bash
# train_local --zero1 as a data-parallel job (docs/scale_out.md, ZeRO-1): W = 2 and 3 ranks under
# mpirun with accumulation W write sharded checkpoints (one optimizer shard per rank, one
# manifest) holding bit for bit the model, optimizer state and trainer state of one process with
# accumulation W. The sharded checkpoints resume on any world size: on 2 ZeRO-1 ranks, in one
# process, and (accumulation 6) on 3 ranks; a one-process checkpoint resumes on 2 ZeRO-1 ranks. A
# ZeRO-1 job whose rank 1 is killed with kill -9 after its first checkpoint ends non-zero, and
# relaunched with --resume ends at the uninterrupted run's bits. --zero1 alone is refused.
set -euo pipefail
launch="$1"
train="$2"
config="$3"
same_optimizer="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
common=(--config="${config}" --micro_batch=1 --seq_len=32 --eval_every=0 --warmup=1 --threads=1
  --optimizer_threads=1 --arena_mb=64 --collective_timeout_s=120)
step() { printf '%s/step-%012d' "$1" "$2"; }
same_state() {  # same_state CHECKPOINT_A CHECKPOINT_B WHAT: model, trainer and optimizer state
  for f in model.safetensors trainer_state.json; do
    cmp "$1/${f}" "$2/${f}" || { echo "FAIL: $3: ${f} differs"; exit 1; }
  done
  python3 "${same_optimizer}" "$1" "$2" || { echo "FAIL: $3: optimizer state differs"; exit 1; }
  echo "$3: model, optimizer state and trainer state equal bit for bit"
}

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
    same_state "$(step "${dir}/alone${world}" "${s}")" "$(step "${dir}/zero1_${world}" "${s}")" \
      "${world} ZeRO-1 ranks vs accumulation ${world}, step ${s}"
  done
done

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
same_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_to_zero1" 4)" \
  "2 ZeRO-1 ranks resumed from 2 shards"
resume zero1_to_alone "$(step "${dir}/zero1_2" 2)" 1 --steps=4 --accumulation=2
same_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/zero1_to_alone" 4)" \
  "one process resumed from 2 shards"
resume alone_to_zero1 "$(step "${dir}/alone2" 2)" 2 --steps=4 --accumulation=2 --zero1
same_state "$(step "${dir}/alone2" 4)" "$(step "${dir}/alone_to_zero1" 4)" \
  "2 ZeRO-1 ranks resumed from a one-process checkpoint"
# 2 -> 3 ranks needs an accumulation both divide (6): with several micro-batches per rank the sum
# order is not one process's, so 3 ZeRO-1 ranks are compared with 3 replicated ranks resuming the
# same 2-shard checkpoint (ZeRO-1 reduces in the same rank order).
six=("${common[@]}" --steps=4 --accumulation=6)
timeout 300 "${launch}" 2 "${train}" "${six[@]}" --data_parallel --zero1 --checkpoint_every=2 \
  --checkpoint_dir="${dir}/six" 2>"${dir}/six.log"
resume six_to_zero1_3 "$(step "${dir}/six" 2)" 3 --steps=4 --accumulation=6 --zero1
resume six_to_replicated_3 "$(step "${dir}/six" 2)" 3 --steps=4 --accumulation=6
same_state "$(step "${dir}/six_to_replicated_3" 4)" "$(step "${dir}/six_to_zero1_3" 4)" \
  "2 shards resumed on 3 ZeRO-1 ranks vs on 3 replicated ranks"

# kill -9 of rank 1 after the first checkpoint. Every step is slowed to about a second (an
# emulated link latency, which changes no result), so the job cannot have finished before the kill
# lands, however fast the machine.
cat >"${dir}/rank.sh" <<EOS
#!/usr/bin/env bash
echo \$\$ >"${dir}/killed.rank\${OMPI_COMM_WORLD_RANK}.pid"
exec "${train}" "\$@"
EOS
chmod +x "${dir}/rank.sh"
eight=("${common[@]}" --steps=8 --accumulation=2 --checkpoint_every=2)
"${train}" "${eight[@]}" --checkpoint_dir="${dir}/alone8" 2>"${dir}/alone8.log"
timeout 300 "${launch}" 2 "${dir}/rank.sh" "${eight[@]}" --zero1 --checkpoint_dir="${dir}/killed" \
  --link_latency_us=50000 >"${dir}/killed.log" 2>&1 &
job=$!
for ((i = 0; i < 3000; ++i)); do
  [[ -d "$(step "${dir}/killed" 2)" ]] && break
  sleep 0.1
done
[[ -d "$(step "${dir}/killed" 2)" ]] || { cat "${dir}/killed.log"; echo "FAIL: no checkpoint"; exit 1; }
kill -9 "$(cat "${dir}/killed.rank1.pid")"
rc=0
wait "${job}" || rc=$?
cat "${dir}/killed.log"
[[ ${rc} -ne 0 && ${rc} -ne 124 ]] || { echo "FAIL: the killed job exited ${rc}"; exit 1; }
[[ ! -e "$(step "${dir}/killed" 8)" ]] || { echo "FAIL: the killed job finished"; exit 1; }
timeout 300 "${launch}" 2 "${train}" "${eight[@]}" --zero1 --resume \
  --checkpoint_dir="${dir}/killed" 2>"${dir}/relaunched.log"
grep -Eq "resumed from .*step-00000000000[246] at step [246]" "${dir}/relaunched.log" ||
  { cat "${dir}/relaunched.log"; echo "FAIL: the relaunched job did not resume"; exit 1; }
grep "resumed from" "${dir}/relaunched.log"
same_state "$(step "${dir}/alone8" 8)" "$(step "${dir}/killed" 8)" \
  "ZeRO-1 job killed (kill -9 rank 1) and relaunched"

# --zero1 outside a data-parallel job is refused, naming what it needs.
if "${train}" "${common[@]}" --steps=4 --zero1 >"${dir}/alone_zero1.log" 2>&1; then
  echo "FAIL: --zero1 without --data_parallel was accepted"; exit 1
fi
grep -q "error: --zero1 needs --data_parallel" "${dir}/alone_zero1.log" ||
  { cat "${dir}/alone_zero1.log"; echo "FAIL: no reason given"; exit 1; }
echo PASS
