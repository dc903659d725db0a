#!/usr/bin/env bash
# The reduce-scatter among ranks (docs/scale_out.md "Reduce-scatter across ranks"): W = 2 and 3
# ranks of one CPU device each, --gradient_reduction=devices or device_shards, accumulation W.
# Each device reduce-scatters its gradients with the other ranks' in rank order and copies out
# 1/W of them, the ranks all-gather the shards: the job writes bit for bit the checkpoint of one
# process with accumulation W, and its trace shows the reduce-scatters on every rank. ZeRO-1 and a
# tied model are refused naming the reason; ranks that disagree on the reduction are refused
# before the first step. A rank killed mid-run ends the job, which resumes to the same bits.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
train="$2"
config="$3"
tied_config="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
run=(--steps=4 --micro_batch=1 --seq_len=32 --eval_every=0 --warmup=1 --threads=1
  --optimizer_threads=1 --arena_mb=64)
# Each rank writes its own trace of the last step.
cat >"${dir}/traced.sh" <<EOS
#!/usr/bin/env bash
exec "${train}" "\$@" --trace="${dir}/trace-\${TRACE_NAME}-\${OMPI_COMM_WORLD_RANK}.json"
EOS
chmod +x "${dir}/traced.sh"

for world in 2 3; do
  job=(--config="${config}" "${run[@]}" --accumulation="${world}")
  "${train}" "${job[@]}" --checkpoint_dir="${dir}/alone${world}" 2>"${dir}/alone${world}.log"
  for mode in devices device_shards; do
    name="${mode}${world}"
    TRACE_NAME="${name}" timeout 300 "${launch}" "${world}" "${dir}/traced.sh" "${job[@]}" \
      --gradient_reduction="${mode}" --checkpoint_dir="${dir}/${name}" 2>"${dir}/${name}.log" ||
      { cat "${dir}/${name}.log"; echo "FAIL: ${name}"; exit 1; }
    grep -q "gradient reduction: a reduce-scatter among the ${world} ranks' devices" \
      "${dir}/${name}.log" || { cat "${dir}/${name}.log"; echo "FAIL: ${name}: no reduction"; exit 1; }
    for ((r = 0; r < world; ++r)); do
      grep -q '"reduce-scatter"' "${dir}/trace-${name}-${r}.json" ||
        { echo "FAIL: ${name}: rank ${r}'s trace has no reduce-scatter"; exit 1; }
    done
    same_state "$(step "${dir}/alone${world}" 4)" "$(step "${dir}/${name}" 4)" \
      "${world} ranks reduce-scattering (${mode}) vs accumulation ${world}"
  done
done

# Two micro-batches per rank: each device sums its own first, as the host's reduction does, so
# the reduce-scatter once a step gives the replicated ranks' bits ((g0 + g1) + (g2 + g3)).
four=(--config="${config}" "${run[@]}" --accumulation=4)
timeout 300 "${launch}" 2 "${train}" "${four[@]}" --checkpoint_dir="${dir}/host4" \
  2>"${dir}/host4.log" || { cat "${dir}/host4.log"; echo "FAIL: host4"; exit 1; }
timeout 300 "${launch}" 2 "${train}" "${four[@]}" --gradient_reduction=devices \
  --checkpoint_dir="${dir}/devices4" 2>"${dir}/devices4.log" ||
  { cat "${dir}/devices4.log"; echo "FAIL: devices4"; exit 1; }
grep -q "gradient reduction: a reduce-scatter among the 2 ranks' devices" "${dir}/devices4.log" ||
  { cat "${dir}/devices4.log"; echo "FAIL: devices4: no reduction"; exit 1; }
same_state "$(step "${dir}/host4" 4)" "$(step "${dir}/devices4" 4)" \
  "2 ranks x 2 micro-batches: reduce-scatter vs the host's reduction"

two=(--config="${config}" "${run[@]}" --accumulation=2)
# kill -9 of rank 1 after the first checkpoint, the survivor then waiting in a reduce-scatter on its
# copy_out stream: mpirun ends the job; relaunched with --resume it ends at the bits of one
# process never interrupted. Steps slowed to about a second (an emulated link latency, which
# changes no result), so the job cannot finish before the kill lands.
write_pid_rank_script "${dir}/rank.sh" "${train}"
eight=("${two[@]}" --steps=8 --checkpoint_every=2 --collective_timeout_s=120)
"${train}" "${eight[@]}" --checkpoint_dir="${dir}/alone8" 2>"${dir}/alone8.log" ||
  { cat "${dir}/alone8.log"; echo "FAIL: alone8"; exit 1; }
RANK_PID_PREFIX="${dir}/killed.rank" timeout 300 "${launch}" 2 "${dir}/rank.sh" "${eight[@]}" \
  --gradient_reduction=devices --checkpoint_dir="${dir}/killed" --link_latency_us=50000 \
  >"${dir}/killed.log" 2>&1 &
mpirun_pid=$!
# Should the test fail before the job ends, the job does not outlive it.
trap 'kill "${mpirun_pid}" 2>/dev/null || true' EXIT
wait_for_checkpoint "${dir}/killed" 2 "${dir}/killed.log" "the reduce-scatter job to kill"
kill -9 "$(cat "${dir}/killed.rank1.pid")" ||
  { cat "${dir}/killed.log"; echo "FAIL: rank 1 was gone before the kill"; exit 1; }
rc=0
wait "${mpirun_pid}" || rc=$?
trap - EXIT
expect_aborted "reduce-scatter job with rank 1 killed" "${rc}" "${dir}/killed.log"
[[ ! -e "$(step "${dir}/killed" 8)" ]] || { echo "FAIL: the killed job finished"; exit 1; }
timeout 300 "${launch}" 2 "${train}" "${eight[@]}" --gradient_reduction=devices --resume \
  --checkpoint_dir="${dir}/killed" 2>"${dir}/relaunched.log" ||
  { cat "${dir}/relaunched.log"; echo "FAIL: relaunch"; exit 1; }
expect_resumed "${dir}/relaunched.log" "reduce-scatter job killed (kill -9 rank 1)"
same_state "$(step "${dir}/alone8" 8)" "$(step "${dir}/killed" 8)" \
  "reduce-scatter job killed (kill -9 rank 1) and relaunched"

expect_refused "ZeRO-1 with a reduce-scatter among ranks" "${dir}/zero1.log" \
  "gradient_reduction across 2 ranks with zero1" \
  timeout 300 "${launch}" 2 "${train}" "${two[@]}" --gradient_reduction=devices --zero1
expect_refused "a tied model with a reduce-scatter among ranks" "${dir}/tied.log" \
  "gradient_reduction=devices across 2 ranks: the model ties its embedding" \
  timeout 300 "${launch}" 2 "${train}" --config="${tied_config}" "${run[@]}" --accumulation=2 \
  --gradient_reduction=devices
cat >"${dir}/per_rank.sh" <<EOS
#!/usr/bin/env bash
mode=host
[[ "\${OMPI_COMM_WORLD_RANK}" == 1 ]] && mode=devices
exec "${train}" ${two[*]} --gradient_reduction="\${mode}"
EOS
chmod +x "${dir}/per_rank.sh"
expect_refused "ranks that disagree on the reduction" "${dir}/mismatch.log" \
  "rank 1 runs a different job from rank 0" timeout 300 "${launch}" 2 "${dir}/per_rank.sh"
echo PASS
