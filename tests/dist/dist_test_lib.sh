# Shared helpers of the data-parallel shell tests (tests/dist/*_test.sh, sourced): checkpoint
# paths, bit-for-bit comparisons of runs and checkpoints, bounded waits, and the checks that a job
# ended non-zero or was refused for a named reason. Each helper prints "FAIL: ..." and exits 1 when
# its check fails; nothing here depends on how fast the machine is (waits are bounded polls).
# shellcheck shell=bash

# step DIR N: the checkpoint directory of step N under DIR.
step() { printf '%s/step-%012d' "$1" "$2"; }

# same_state CHECKPOINT_A CHECKPOINT_B WHAT [SAME_OPTIMIZER_PY]: the model and trainer state equal
# bit for bit, and the optimizer state too: optimizer.safetensors compared byte for byte, or, with
# SAME_OPTIMIZER_PY (same_optimizer_state.py), compared tensor by tensor across shard layouts.
same_state() {
  local f
  for f in model.safetensors trainer_state.json; do
    cmp "$1/${f}" "$2/${f}" || { echo "FAIL: $3: ${f} differs"; exit 1; }
  done
  if [[ $# -ge 4 ]]; then
    python3 "$4" "$1" "$2" || { echo "FAIL: $3: optimizer state differs"; exit 1; }
  else
    cmp "$1/optimizer.safetensors" "$2/optimizer.safetensors" ||
      { echo "FAIL: $3: optimizer.safetensors differs"; exit 1; }
  fi
  echo "$3: model, optimizer state and trainer state equal bit for bit"
}

# same_run PREFIX_A PREFIX_B WHAT: dp_exactness_worker's losses and weights files of the two
# prefixes equal bit for bit (the losses' diff shown otherwise).
same_run() {
  local what
  for what in losses weights; do
    cmp "$1.${what}" "$2.${what}" || {
      echo "FAIL: $3: ${what} differ"
      diff "$1.losses" "$2.losses" || true
      exit 1
    }
  done
}

# ranks_equal_accumulation LAUNCH WORKER DIR STEPS MODE LABEL [STEM]: for W = 2 and 3, W ranks of
# dp_exactness_worker in MODE (0 = replicated, zero1, 1 = tied, tiedzero1) give every rank the
# losses and final weights of one process with accumulation W, the worker alone in the same MODE
# (alone, ZeRO-1 is plain accumulation; a tied MODE stays tied). Prefixes DIR/<STEM>W.accum and
# DIR/<STEM>W.rankR, STEM "w" unless given.
ranks_equal_accumulation() {
  local launch="$1" worker="$2" dir="$3" steps="$4" mode="$5" label="$6" stem="${7:-w}" world r
  for world in 2 3; do
    local prefix="${dir}/${stem}${world}"
    "${worker}" "${prefix}" "${world}" "${steps}" "${mode}"
    timeout 300 "${launch}" "${world}" "${worker}" "${prefix}" "${world}" "${steps}" "${mode}"
    [[ "$(wc -l <"${prefix}.accum.losses")" == "${steps}" ]] ||
      { echo "FAIL: ${prefix}.accum.losses has not ${steps} steps"; exit 1; }
    for ((r = 0; r < world; ++r)); do
      same_run "${prefix}.accum" "${prefix}.rank${r}" \
        "${label}W=${world}: rank ${r} vs accumulation ${world}"
    done
    echo "${label}W=${world}: every rank's losses and weights equal accumulation ${world}" \
      "bit for bit"
  done
}

# accumulation_changes_weights WORKER DIR STEPS: the bitwise checks are not vacuous: accumulation
# 1 ends at other weights than accumulation 2 (DIR/w2.accum, written by ranks_equal_accumulation).
accumulation_changes_weights() {
  "$1" "$2/w1" 1 "$3" 0
  if cmp -s "$2/w1.accum.weights" "$2/w2.accum.weights"; then
    echo "FAIL: accumulation 1 and 2 gave the same weights"; exit 1
  fi
}

# wait_for_path TEST PATH TENTHS: polls `test TEST PATH` (e.g. -d, -s) every 0.1 s, at most TENTHS
# times; returns the last test's status.
wait_for_path() {
  local i
  for ((i = 0; i < $3; ++i)); do
    test "$1" "$2" && return 0
    sleep 0.1
  done
  test "$1" "$2"
}

# wait_for_checkpoint RUN N LOG WHAT: RUN's step-N checkpoint appears within 300 s (LOG shown
# otherwise).
wait_for_checkpoint() {
  wait_for_path -d "$(step "$1" "$2")" 3000 ||
    { cat "$3"; echo "FAIL: $4: no checkpoint"; exit 1; }
}

# write_pid_rank_script SCRIPT TRAIN: SCRIPT, run by mpirun or srun for each rank, writes its pid
# to ${RANK_PID_PREFIX}<rank>.pid (RANK_PID_PREFIX from the environment) and execs TRAIN with its
# arguments, so a test can stop or kill one rank.
write_pid_rank_script() {
  cat >"$1" <<EOS
#!/usr/bin/env bash
echo \$\$ >"\${RANK_PID_PREFIX}\${OMPI_COMM_WORLD_RANK:-\${SLURM_PROCID}}.pid"
exec "$2" "\$@"
EOS
  chmod +x "$1"
}

# expect_aborted WHAT RC LOG: a job expected to fail (a rank killed, stopped or failing) exited
# non-zero, and not by the test's `timeout` (124). LOG is shown first.
expect_aborted() {
  cat "$3"
  echo "$1: the launcher (mpirun or srun) exited $2"
  [[ $2 -ne 0 ]] || { echo "FAIL: $1: the job exited 0"; exit 1; }
  [[ $2 -ne 124 ]] || { echo "FAIL: $1: the job did not end within its timeout"; exit 1; }
}

# expect_resumed LOG WHAT: a relaunched job says it resumed from step 2, 4 or 6.
expect_resumed() {
  grep -Eq "resumed from .*step-00000000000[246] at step [246]" "$1" ||
    { cat "$1"; echo "FAIL: $2: the relaunched job did not resume"; exit 1; }
  grep "resumed from" "$1"
}

# expect_refused WHAT LOG PATTERN COMMAND...: COMMAND fails, and its output (stdout and stderr,
# kept in LOG) holds PATTERN (grep -E), the reason it names.
expect_refused() {
  local what="$1" log="$2" pattern="$3"
  shift 3
  if "$@" >"${log}" 2>&1; then
    echo "FAIL: ${what} was accepted"; exit 1
  fi
  grep -Eq -- "${pattern}" "${log}" ||
    { cat "${log}"; echo "FAIL: ${what}: the reason (${pattern}) was not given"; exit 1; }
}
