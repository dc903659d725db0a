#!/usr/bin/env bash
# A rank that hangs (SIGSTOP) makes the whole job fail within a bounded time (docs/scale_out.md,
# "Failures"): the rank left waiting in a collective past --collective_timeout_s prints its rank,
# host, the collective and the step, and ends the job with MPI_Abort; mpirun exits non-zero and
# the stopped rank is gone. Relaunched with --resume, the job continues from the last checkpoint
# and ends at the uninterrupted run's bits. Twice: rank 0 stopped in a replicated job (rank 1
# reports; rank 0 wrote the checkpoints) and rank 1 stopped in a ZeRO-1 job (rank 0 reports).
#
# Nothing depends on the machine's speed: the rank is stopped once its job has committed its
# first checkpoint, and every step is slowed to about a second (an emulated link latency, which
# changes no result), so the job cannot have finished before the stop lands. The bound (120 s
# after the stop) is far above what it takes (the 20 s timeout and a second).
set -uo pipefail
source "$(dirname "$0")/dist_test_lib.sh"
launch="$1"
train="$2"
config="$3"
same_optimizer="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
host="$(cat /proc/sys/kernel/hostname)"
job=(--config="${config}" --steps=8 --micro_batch=1 --seq_len=32 --accumulation=2 --eval_every=0
  --warmup=1 --threads=1 --optimizer_threads=1 --arena_mb=64 --checkpoint_every=2)

"${train}" "${job[@]}" --checkpoint_dir="${dir}/alone" 2>"${dir}/alone.log" ||
  { cat "${dir}/alone.log"; echo "FAIL: the one-process run failed"; exit 1; }
write_pid_rank_script "${dir}/rank.sh" "${train}"

stop_and_resume() {  # stop_and_resume NAME STOPPED_RANK REPORTING_RANK [FLAGS...]
  local name="$1" stopped="$2" reporting="$3"
  shift 3
  local run="${dir}/${name}"
  RANK_PID_PREFIX="${run}.rank" timeout 300 "${launch}" 2 "${dir}/rank.sh" "${job[@]}" "$@" \
    --checkpoint_dir="${run}" --link_latency_us=50000 --collective_timeout_s=20 \
    >"${run}.log" 2>&1 &
  local mpirun=$!
  wait_for_checkpoint "${run}" 2 "${run}.log" "${name}"
  local pid
  pid="$(cat "${run}.rank${stopped}.pid")"
  kill -STOP "${pid}"
  SECONDS=0
  wait "${mpirun}"
  local rc=$?
  local took=${SECONDS}
  expect_aborted "${name}" "${rc}" "${run}.log"
  echo "${name}: mpirun ended ${took} s after rank ${stopped} was stopped"
  ((took <= 120)) || { echo "FAIL: ${name}: the job took ${took} s to end"; exit 1; }
  grep -Eq "error: rank ${reporting} of 2 on host ${host}: collective .* at step [0-9]+ did not complete within 20 s" \
    "${run}.log" || { echo "FAIL: ${name}: no report naming rank ${reporting} and ${host}"; exit 1; }
  # The stopped rank, continued by mpirun before it is killed, does not blame the others: the time
  # it did not run does not count against its own deadline.
  if grep -Eq "error: rank ${stopped} of 2 on host .* did not complete within 20 s;" "${run}.log"; then
    echo "FAIL: ${name}: the stopped rank reported the ranks that waited for it"; exit 1
  fi
  [[ ! -e "$(step "${run}" 8)" ]] || { echo "FAIL: ${name}: the stopped job finished"; exit 1; }
  # The stopped rank is gone (a zombie at most, where nobody reaps it), not left stopped. A rank
  # that was killed can still be exiting (state D while the kernel releases its memory and files:
  # seen once in CI), so wait for the exit to finish, bounded.
  local state tries=0
  while :; do
    state="$(awk '{print $3}' "/proc/${pid}/stat" 2>/dev/null || echo gone)"
    [[ "${state}" == gone || "${state}" == Z ]] && break
    ((++tries > 600)) && break
    sleep 0.1
  done
  [[ "${state}" == gone || "${state}" == Z ]] ||
    { echo "FAIL: ${name}: the stopped rank is still there (state ${state})"; kill -9 "${pid}"; exit 1; }

  timeout 300 "${launch}" 2 "${train}" "${job[@]}" "$@" --resume --checkpoint_dir="${run}" \
    2>"${run}.relaunched.log"
  expect_resumed "${run}.relaunched.log" "${name}"
  same_state "$(step "${dir}/alone" 8)" "$(step "${run}" 8)" \
    "${name}: relaunched from its last checkpoint vs the uninterrupted run" "${same_optimizer}"
}

stop_and_resume replicated 0 1 --data_parallel
stop_and_resume zero1 1 0 --data_parallel --zero1

# A rank that stops before MPI starts: the others wait in MPI's start-up, which no collective's
# watchdog covers; its own deadline (the collective timeout) ends the job, naming the host.
cat >"${dir}/stop_before_mpi.sh" <<EOS
#!/usr/bin/env bash
[[ "\${OMPI_COMM_WORLD_RANK:-0}" == 1 ]] && kill -STOP \$\$
exec "${train}" "\$@"
EOS
chmod +x "${dir}/stop_before_mpi.sh"
SECONDS=0
timeout 300 "${launch}" 2 "${dir}/stop_before_mpi.sh" "${job[@]}" --data_parallel \
  --checkpoint_dir="${dir}/startup" --collective_timeout_s=10 >"${dir}/startup.log" 2>&1
rc=$?
took=${SECONDS}
expect_aborted "a rank stopped before MPI's start-up" "${rc}" "${dir}/startup.log"
echo "start-up: mpirun ended ${took} s after the launch"
grep -q "error: MPI start-up on host ${host} did not complete within 10 s" "${dir}/startup.log" ||
  { echo "FAIL: no start-up deadline report naming ${host}"; exit 1; }

# A negative timeout is refused, naming the flag.
expect_refused "--collective_timeout_s=-1" "${dir}/negative.log" \
  "collective_timeout_s=-1 must be >= 0" "${train}" "${job[@]}" --collective_timeout_s=-1
echo PASS
