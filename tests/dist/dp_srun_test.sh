#!/usr/bin/env bash
# Ranks launched by Slurm (docs/scale_out.md "Launching with srun"): a private one-node Slurm
# cluster (private_slurm.sh) and `srun --mpi=pmix`, no mpirun. The MPI world forms over PMIx (the
# communicator's collectives exact, every rank local to the one machine); 2 ranks of train_local
# write bit for bit the checkpoint of one process with accumulation 2, and 3 ZeRO-1 ranks with 2
# devices each that of 3 ranks of one device (6 micro-batches); a rank that fails ends the step
# through MPI_Abort naming itself; a rank killed with kill -9 after the first checkpoint ends the
# step (srun --kill-on-bad-exit), and the job relaunched with --resume ends at the bits of the run
# never interrupted.
set -euo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
source "$(dirname "$0")/private_slurm.sh"
check="$1"
train="$2"
config="$3"
same_optimizer="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
start_private_slurm 4
# Open MPI under PMIx direct launch: shared memory and TCP on loopback, its session directory
# here (Bazel's sandbox has no writable /tmp of its own to rely on).
# Ranks waiting in MPI yield their core (two cores here, shared with the other rank's compute).
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo TMPDIR="${dir}"
export OMPI_MCA_mpi_yield_when_idle=1
# srun_ranks N PROGRAM ARGS...: N tasks of one job step, as a batch script's srun would start them
# (a script, so that `timeout` can run it).
srun_ranks="${dir}/srun_ranks"
cat >"${srun_ranks}" <<'EOS'
#!/usr/bin/env bash
n="$1"
shift
exec srun --mpi=pmix --ntasks="${n}" --overcommit --kill-on-bad-exit=1 "$@"
EOS
chmod +x "${srun_ranks}"

for ranks in 2 3; do
  out="$(timeout 120 "${srun_ranks}" "${ranks}" "${check}" "${ranks}" 2>&1)" ||
    { echo "${out}"; echo "FAIL: the communicator's check under srun with ${ranks} ranks"; exit 1; }
  for ((r = 0; r < ranks; ++r)); do
    grep -q "rank ${r} of ${ranks}: all collectives exact" <<<"${out}" ||
      { echo "${out}"; echo "FAIL: rank ${r} of ${ranks} did not report under srun"; exit 1; }
  done
  echo "srun, ${ranks} ranks over PMIx: every collective exact, every rank local"
done

run=(--config="${config}" --micro_batch=1 --seq_len=32 --eval_every=0 --warmup=1 --threads=1
  --optimizer_threads=1 --arena_mb=64 --collective_timeout_s=120)
two=("${run[@]}" --steps=4 --accumulation=2)
"${train}" "${two[@]}" --checkpoint_dir="${dir}/alone" 2>"${dir}/alone.log"
timeout 300 "${srun_ranks}" 2 "${train}" "${two[@]}" --checkpoint_dir="${dir}/srun" \
  2>"${dir}/srun.log" || { cat "${dir}/srun.log"; echo "FAIL: 2 ranks under srun"; exit 1; }
[[ "$(grep -c "^step 4/4 .* comm " "${dir}/srun.log")" == 1 ]] ||
  { cat "${dir}/srun.log"; echo "FAIL: not one rank-0 progress line with its communication"; exit 1; }
same_state "$(step "${dir}/alone" 4)" "$(step "${dir}/srun" 4)" "srun: 2 ranks vs accumulation 2"

six=("${run[@]}" --steps=4 --accumulation=6)
timeout 300 "${srun_ranks}" 3 "${train}" "${six[@]}" --checkpoint_dir="${dir}/one_device" \
  2>"${dir}/one_device.log" || { cat "${dir}/one_device.log"; echo "FAIL: 3 ranks"; exit 1; }
timeout 300 "${srun_ranks}" 3 "${train}" "${six[@]}" --zero1 --devices=2 \
  --checkpoint_dir="${dir}/zero1_devices" 2>"${dir}/zero1_devices.log" ||
  { cat "${dir}/zero1_devices.log"; echo "FAIL: 3 ZeRO-1 ranks of 2 devices"; exit 1; }
same_state "$(step "${dir}/one_device" 4)" "$(step "${dir}/zero1_devices" 4)" \
  "srun: 3 ZeRO-1 ranks x 2 devices vs 3 ranks x 1 device" "${same_optimizer}"

# Rank 1 alone fails after MPI is up (data it cannot read): MPI_Abort ends the step.
cat >"${dir}/per_rank.sh" <<EOS
#!/usr/bin/env bash
text=/usr/share/games/fortunes
[[ "\${SLURM_PROCID}" == 1 ]] && text="${dir}/no_such_corpus"
exec "${train}" ${two[*]} --text="\${text}"
EOS
chmod +x "${dir}/per_rank.sh"
rc=0
timeout 120 "${srun_ranks}" 2 "${dir}/per_rank.sh" >"${dir}/error.log" 2>&1 || rc=$?
expect_aborted "srun: an error on rank 1" "${rc}" "${dir}/error.log"
grep -q "error: rank 1 of 2 on host [^:]*: .*no_such_corpus" "${dir}/error.log" ||
  { echo "FAIL: rank 1's error was not printed with its rank"; exit 1; }

# kill -9 of rank 1 after the first checkpoint (steps slowed to about a second by an emulated
# link latency, which changes no result, so the job cannot finish before the kill lands).
write_pid_rank_script "${dir}/rank.sh" "${train}"
eight=("${run[@]}" --steps=8 --accumulation=2 --checkpoint_every=2)
"${train}" "${eight[@]}" --checkpoint_dir="${dir}/alone8" 2>"${dir}/alone8.log"
RANK_PID_PREFIX="${dir}/killed.rank" timeout 300 "${srun_ranks}" 2 "${dir}/rank.sh" "${eight[@]}" \
  --checkpoint_dir="${dir}/killed" --link_latency_us=50000 >"${dir}/killed.log" 2>&1 &
srun_pid=$!
wait_for_checkpoint "${dir}/killed" 2 "${dir}/killed.log" "the srun job to kill"
kill -9 "$(cat "${dir}/killed.rank1.pid")"
rc=0
wait "${srun_pid}" || rc=$?
expect_aborted "srun: rank 1 killed" "${rc}" "${dir}/killed.log"
grep -Eq "task 1: Killed|task 1.*signal 9|tasks? .*1.*(Killed|Terminated)" "${dir}/killed.log" ||
  { echo "FAIL: srun did not name the killed task"; exit 1; }
[[ ! -e "$(step "${dir}/killed" 8)" ]] || { echo "FAIL: the killed job finished"; exit 1; }
timeout 300 "${srun_ranks}" 2 "${train}" "${eight[@]}" --resume --checkpoint_dir="${dir}/killed" \
  2>"${dir}/relaunched.log" || { cat "${dir}/relaunched.log"; echo "FAIL: relaunch"; exit 1; }
expect_resumed "${dir}/relaunched.log" "srun job killed (kill -9 rank 1)"
same_state "$(step "${dir}/alone8" 8)" "$(step "${dir}/killed" 8)" \
  "srun: job killed (kill -9 rank 1) and relaunched"
echo PASS
